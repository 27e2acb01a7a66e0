#!/usr/bin/env bash
# clang-tidy on the whole tree (`make lint`, run by CI): every project source in the build's
# compile_commands.json (daemon, client, base, proto, gpu, testing, tools, tests, bench, examples;
# not generated files, not CUDA kernels), with the checks of .clang-tidy (tests/.clang-tidy for the
# tests), and the project's headers through them.
# Any finding fails (WarningsAsErrors). Prints the files linted, the findings and the wall time.
#
# A result is cached per translation unit (LINT_CACHE, default BUILD_DIR/lint-cache) under the
# hash of its preprocessed text, its compile command, the .clang-tidy files and clang-tidy's
# version: a file whose code and headers did not change is not linted again (a clean tree re-lints
# in seconds).
#
#   scripts/lint.sh [FILE...]   BUILD_DIR (default build), JOBS (default nproc), LINT_CACHE
#                               (empty: no cache, and no preprocessing for its key), CLANG_TIDY
#                               (default: the pinned one of scripts/install-deps.sh test, in
#                               SPDL_TOOLS_VENV); FILEs (default: all) as paths from the repository
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build="${BUILD_DIR:-build}"
jobs="${JOBS:-$(nproc)}"
cache="${LINT_CACHE-$build/lint-cache}"
# The pinned clang-tidy that scripts/install-deps.sh installs into the test tools' venv (its binary,
# not the venv's Python wrapper: no interpreter start per file); CLANG_TIDY=PATH runs another one
# (another version may find other things).
venv="${SPDL_TOOLS_VENV:-/opt/spdld-test-tools}"
tidy="${CLANG_TIDY:-}"
if [ -z "$tidy" ]; then
  for t in "$venv"/lib/python3*/site-packages/clang_tidy/data/bin/clang-tidy; do
    [ -x "$t" ] && tidy=$t
  done
fi
[ -n "$tidy" ] || { echo "lint: no clang-tidy in $venv (scripts/install-deps.sh test; or CLANG_TIDY=PATH)"; exit 2; }
command -v "$tidy" >/dev/null || { echo "lint: $tidy not installed (scripts/install-deps.sh test)"; exit 2; }
echo "lint: clang-tidy $("$tidy" --version | sed -n 's/.*LLVM version \([^ ]*\).*/\1/p') ($tidy)"
db="$build/compile_commands.json"
[ -f "$db" ] || { echo "lint: no $db (configure the build first: make configure)"; exit 2; }
t0=$SECONDS
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
[ -n "$cache" ] && mkdir -p "$cache"

# The sources to lint: the project's, as compiled (one entry per file), or the FILEs given. The
# compile commands clang-tidy reads ($out/db) are the build's less the test executables' precompiled
# header (`-include .../cmake_pch.hxx`, SPDL_TEST_PCH in tests/CMakeLists.txt): clang cannot read
# gcc's .gch, so it would parse the header's text in every test, and without it each test must
# include what it uses itself (a missing include is a clang error here, which gcc's build with the
# header forced in would not see).
mkdir -p "$out/db"
python3 - "$db" "$root" "$out/files" "$out/db/compile_commands.json" "$@" <<'EOF'
import json, os, re, sys
db, root, dest, lint_db, wanted = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
entries = json.load(open(db))
pch = re.compile(r"(?:^|\s)-Winvalid-pch(?=\s)|(?:^|\s)-include\s+\S*/cmake_pch\.hxx(?=\s)")
for e in entries:
    if "command" in e:
        e["command"] = pch.sub("", e["command"])
    if "arguments" in e:
        args = e["arguments"]
        e["arguments"] = [a for i, a in enumerate(args) if a != "-Winvalid-pch" and not (
            a == "-include" and i + 1 < len(args) and args[i + 1].endswith("/cmake_pch.hxx")) and not (
            i > 0 and args[i - 1] == "-include" and a.endswith("/cmake_pch.hxx"))]
json.dump(entries, open(lint_db, "w"), indent=0)
tops = ("base/", "proto/", "gpu/", "daemon/", "client/", "testing/", "tools/", "tests/", "bench/", "examples/")
seen = []
for e in entries:
    f = os.path.normpath(os.path.join(e["directory"], e["file"]))
    rel = os.path.relpath(f, root)
    # .cu: nvcc's command line (--generate-code, -Xcompiler=...), which clang cannot read; the
    # CUDA sources are the kernels, their host-side logic is in .cc files linted here.
    if not rel.startswith(tops) or rel in seen or rel.endswith(".cu"):
        continue
    if wanted and rel not in wanted:
        continue
    seen.append(rel)
open(dest, "w").write("".join(r + "\n" for r in sorted(seen)))
EOF
n=$(wc -l <"$out/files")
[ "$n" -gt 0 ] || { echo "lint: no source to lint"; exit 2; }

export root build cache tidy out
export header_filter="^$root/(base|gpu|daemon|client|proto|testing|tools|tests|bench|examples|include/spdl)/([^/]+/)*[^/.]+\\.h\$"
export salt
salt=$( { "$tidy" --version; cat .clang-tidy */.clang-tidy; } | sha256sum | cut -c1-16)
lint_one() {
  local f="$1" key="" log
  log="$out/$(echo "$f" | tr '/' '_').log"
  if [ -n "$cache" ]; then
    # The preprocessed text (the file and every header it includes) and the compile command.
    key=$(python3 - "$out/db/compile_commands.json" "$root/$f" <<'EOF'
import hashlib, json, os, shlex, subprocess, sys
db, path = sys.argv[1], sys.argv[2]
for e in json.load(open(db)):
    if os.path.normpath(os.path.join(e["directory"], e["file"])) != path:
        continue
    args = e.get("arguments") or shlex.split(e["command"])
    pre, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD"):
            continue
        pre.append(a)
    text = subprocess.run(pre + ["-E", "-P"], cwd=e["directory"], capture_output=True).stdout
    print(hashlib.sha256(" ".join(args).encode() + b"\0" + text).hexdigest())
    break
EOF
)
    if [ -n "$key" ] && [ -f "$cache/$salt-$key" ]; then
      cp "$cache/$salt-$key" "$log"
      return 0
    fi
  fi
  local rc=0
  "$tidy" -p "$out/db" --quiet --header-filter="$header_filter" "$f" >"$log" 2>&1 || rc=$?
  grep -v -E '^[0-9]+ warnings? (and [0-9]+ errors? )?generated\.?$|^Suppressed [0-9]+ warnings|^Use -header-filter|^Use -system-headers|^Error while processing' \
    "$log" >"$log.kept" || true
  mv "$log.kept" "$log"
  if [ "$rc" -eq 0 ]; then
    if [ -n "$key" ]; then cp "$log" "$cache/$salt-$key"; fi  # only clean results are kept
  elif ! grep -q -E '(warning|error): .*\[[a-z0-9.,-]+\]$' "$log"; then
    echo "lint: clang-tidy failed on $f (exit $rc)" >>"$log"
  fi
  return 0
}
export -f lint_one
xargs -a "$out/files" -P "$jobs" -I{} bash -c 'lint_one "$@"' _ {} &
xargs_pid=$!
trap 'kill "$xargs_pid" 2>/dev/null || true; rm -rf "$out"' EXIT  # interrupted: start no more files
wait "$xargs_pid"

cat "$out"/*.log >"$out/all" 2>/dev/null || true
# A header's finding shows once (every file including the header reports it).
findings=$(grep -E '(warning|error): .*\[[a-z0-9.,-]+\]$|^lint: clang-tidy failed' "$out/all" | sort -u || true)
if [ -n "$findings" ]; then
  echo "$findings"
  echo "lint: $(echo "$findings" | wc -l) finding(s) in $n files, $(( SECONDS - t0 ))s (JOBS=$jobs)"
  # The context of each (the source line and the note), for the log.
  grep -v -E '^\s*$' "$out/all" | head -n 400 >&2 || true
  exit 1
fi
echo "lint: clean, $n files in $(( SECONDS - t0 ))s (JOBS=$jobs)"
