#!/usr/bin/env bash
# clang-format on the project's C++ and CUDA sources with .clang-format (Google style, 120 columns).
#
#   scripts/format.sh          check: lists every file that is not formatted, fails if any (make test)
#   scripts/format.sh --fix    formats them in place (make format)
#
# The files: every tracked *.h, *.cc, *.cu, *.cuh (git ls-files), so generated and third-party
# files outside the repository are never touched. CLANG_FORMAT picks the binary (default
# clang-format; Debian 12's is version 14 — another version may format some lines differently).
set -euo pipefail
cd "$(dirname "$0")/.."
fmt="${CLANG_FORMAT:-clang-format}"
command -v "$fmt" >/dev/null || { echo "format: $fmt not installed (scripts/install-deps.sh test)"; exit 2; }
mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cu' '*.cuh')
[ ${#files[@]} -gt 0 ] || { echo "format: no sources found (not a git checkout?)"; exit 2; }
if [ "${1:-}" = "--fix" ]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$fmt" -i
  echo "format: ${#files[@]} files formatted"
  exit 0
fi
# One clang-format per 50 files; a file that differs is named in its "code should be
# clang-formatted" diagnostics.
mapfile -t bad < <(printf '%s\0' "${files[@]}" | xargs -0 -n 50 -P 2 "$fmt" --dry-run 2>&1 \
  | sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: .*code should be clang-formatted.*/\1/p' | sort -u)
if [ ${#bad[@]} -gt 0 ]; then
  printf 'format: not clang-formatted: %s\n' "${bad[@]}"
  echo "format: ${#bad[@]} of ${#files[@]} files differ from .clang-format; run: make format"
  exit 1
fi
echo "format: ${#files[@]} files clean"
