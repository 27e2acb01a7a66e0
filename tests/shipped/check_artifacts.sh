#!/usr/bin/env bash
# Checks that shipped binaries carry no test seam: no "test-only" text, no fake GPU backend symbol,
# none of the test environment variables, no reference decode path (SPDL_TEST_HOOKS=OFF builds).
#
#   check_artifacts.sh clean FILE...   exit 0 when no FILE has any marker; 1 (and each hit) otherwise
#   check_artifacts.sh hooks FILE...   the reverse, for the checker's own test: exit 0 when every FILE
#                                      has at least one marker (a test build), 1 when one has none
# Markers are searched in the printable strings (`strings -a`) and the demangled symbol names
# (`nm -C`, dynamic symbols too) of each file.
set -euo pipefail
mode=${1:-}
shift || true
if [ "$mode" != clean ] && [ "$mode" != hooks ] || [ $# -eq 0 ]; then
  echo "usage: $0 clean|hooks FILE..." >&2
  exit 2
fi
for tool in strings nm; do
  command -v $tool >/dev/null || { echo "check_artifacts: $tool not installed (binutils)"; exit 2; }
done
# What only test seams contain (testing/, #if SPDL_TEST_HOOKS blocks).
markers='test-only|TEST ONLY|test seam|FakeBackend|ShmFake|shmfake|SPDL_TEST_FAKE|SPDLD_TEST_|ForTests|stage_hook|ReferenceDecodeInto|EncodeJpeg|EncodeImage'
rc=0
for f in "$@"; do
  [ -f "$f" ] || { echo "check_artifacts: no file $f"; exit 2; }
  hits=$( { strings -a "$f"; nm -C "$f" 2>/dev/null || true; nm -C -D "$f" 2>/dev/null || true; } |
          grep -E "$markers" | sort -u | head -n 20 || true)
  if [ "$mode" = clean ]; then
    if [ -n "$hits" ]; then
      echo "FAIL: $f carries test seams:"
      echo "$hits" | sed 's/^/  /'
      rc=1
    else
      echo "ok: $f has no test seam"
    fi
  else
    if [ -z "$hits" ]; then
      echo "FAIL: $f was expected to carry test seams (a test build) but none was found"
      rc=1
    else
      echo "ok: $f carries test seams, e.g. $(echo "$hits" | head -n 1)"
    fi
  fi
done
exit $rc
