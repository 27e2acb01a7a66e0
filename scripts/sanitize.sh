#!/usr/bin/env bash
# Runs the C++ tests under sanitizers, each in its own build directory (CUDA off, SANITIZE_OPT, asserts on):
#   asan  the tests in ASAN_TESTS (default: every ctest test), built with
#         SPDL_SANITIZE=address,undefined                                (build-asan)
#   tsan  the concurrency-heavy tests in TSAN_TESTS, built with SPDL_SANITIZE=thread (build-tsan)
# Only the test executables named (and the tools the end-to-end tests start) are built.
# Sanitizer reports fail the run even when the test that provoked them passed (a daemon or client
# process started by an end-to-end test reports into the test's output): after ctest, the full
# output of every test is searched for reports. Prints the wall and CPU time of each step and the load.
#
#   scripts/sanitize.sh [asan] [tsan]      (default: both)
#   SANITIZE_SUBSET=ci       the subsets CI runs (make ci-sanitize): ASan+UBSan on the unit tests
#                            and task_exception_test, TSan on shm_test pipeline_test server_test
#                            task_exception_test
#   ASAN_TESTS, TSAN_TESTS   test executables to build and run ("all" = every test, asan only)
#   JOBS=N                   build and ctest parallelism (default nproc)
#   ASAN_BUILD_DIR, TSAN_BUILD_DIR         (default build-asan, build-tsan)
#   SANITIZE_ASAN_BUILD=fuzz the asan part in clang's fuzzing build instead (cmake -C
#                            cmake/clang-asan-fuzz.cmake; default dir build-fuzz-asan, the one
#                            `FUZZ_WITH_TESTS=1 scripts/fuzz.sh` builds): the libraries it already
#                            compiled with fuzzer-no-link,address,undefined at -O1 are reused, only
#                            the tests' own sources (-O0) and what the fuzz targets do not use are
#                            compiled. CI does this (make ci-sanitize after make ci-fuzz).
#   CTEST_ARGS="-R config_test"            extra ctest arguments for both parts
#   SANITIZE_OPT="-O1 -g"    optimisation and debug flags (default "-O0 -g": a third of -O1's compile time
#                            under the sanitizers, which is most of this script's time; the tests run a
#                            little slower)
set -euo pipefail
cd "$(dirname "$0")/.."

parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(asan tsan)
jobs="${JOBS:-$(nproc)}"
asan_build="${SANITIZE_ASAN_BUILD:-gcc}"
case "$asan_build" in
  gcc) asan_dir="${ASAN_BUILD_DIR:-build-asan}" ;;
  fuzz) asan_dir="${ASAN_BUILD_DIR:-build-fuzz-asan}" ;;
  *) echo "SANITIZE_ASAN_BUILD is gcc or fuzz, not $asan_build" >&2; exit 2 ;;
esac
tsan_dir="${TSAN_BUILD_DIR:-build-tsan}"
opt="${SANITIZE_OPT:--O0 -g}"
if [ "${SANITIZE_SUBSET:-}" = ci ]; then
  # Chosen to fit CI's time budget (.ci/README.md): the unit tests of the parsers, the media
  # decoders, the pipeline, the slot ring and the control server under ASan+UBSan (the end-to-end
  # tests need the daemon and client binaries, which doubled the build: run them by hand with
  # ASAN_TESTS="e2e_test client_test"); the thread pool, pipeline, slot ring and control server
  # under TSan. Both run task_exception_test (a real spdld whose decode tasks throw): spdld adds
  # only daemon.cc, main.cc and spdl_ops to what server_test already builds.
  : "${ASAN_TESTS:=common_test config_test io_test media_test shm_test codec_test pipeline_test server_test targets_test task_exception_test}"
  : "${TSAN_TESTS:=shm_test pipeline_test server_test task_exception_test}"
fi
read -r -a asan_tests <<<"${ASAN_TESTS:-all}"
read -r -a tsan_tests <<<"${TSAN_TESTS:-shm_test pipeline_test server_test client_test e2e_test task_exception_test}"
# Binaries the end-to-end tests start (tests/e2e: spdld, spdl-client, spdlctl).
tools=(spdld spdl-client spdlctl)

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1}"

timings=()
load() { cut -d' ' -f1-3 /proc/loadavg; }
# cpu_now: sets $cpu_secs to the CPU seconds (user + system) used so far by this shell's finished
# children. `times` must run in this shell itself: in a pipeline or $(...) it would report a
# fresh subshell's zero.
times_file=$(mktemp)
trap 'rm -f "$times_file"' EXIT
cpu_now() {
  times >"$times_file"
  cpu_secs=$(tail -n 1 "$times_file" |
    awk '{ split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%.1f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }')
}
# timed NAME CMD...: runs CMD, records its wall time, CPU time and the load before and after; keeps
# going on failure (the status is returned). On a shared machine the CPU time is the steadier figure.
timed() {
  local name="$1" t0 c0 rc load0
  shift
  load0=$(load)
  t0=$(date +%s)
  cpu_now
  c0=$cpu_secs
  set +e
  "$@"
  rc=$?
  set -e
  cpu_now
  timings+=("$(printf '%-15s wall %5ss  cpu %5ss  rc=%d  load %s -> %s' "$name" "$(( $(date +%s) - t0 ))" \
    "$(awk -v a="$cpu_secs" -v b="$c0" 'BEGIN { printf "%.0f", a - b }')" "$rc" "$load0" "$(load)")")
  return "$rc"
}

configure() {  # DIR SANITIZERS
  if [ "$2" = address,undefined ] && [ "$asan_build" = fuzz ]; then
    if ! command -v clang++ >/dev/null; then
      echo "sanitize: SANITIZE_ASAN_BUILD=fuzz needs clang (scripts/fuzz.sh installs it: make ci-fuzz first)" >&2
      return 2
    fi
    cmake -S . -B "$1" -G Ninja -C cmake/clang-asan-fuzz.cmake >/dev/null
    return
  fi
  cmake -S . -B "$1" -G Ninja -DSPDL_SANITIZE="$2" -DSPDL_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="$opt" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt" >/dev/null
}

# Sanitizer reports in the full output of every test of the last ctest run in DIR (ctest keeps
# only 1 KiB of a passing test's output unless told otherwise; see --test-output-size-passed).
reports() {
  local logfile="$1/Testing/Temporary/LastTest.log"
  [ -f "$logfile" ] || return 0
  grep -nE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|WARNING: ThreadSanitizer|ThreadSanitizer: reported|SUMMARY: (Address|Leak|Thread|UndefinedBehavior)Sanitizer' "$logfile" || true
}

run_ctest() {  # DIR ARGS...
  local dir="$1"
  shift
  (cd "$dir" && ctest --output-on-failure -j "$jobs" --test-output-size-passed 1048576 \
     --test-output-size-failed 4194304 "$@" ${CTEST_ARGS:-})
}

# The tools the end-to-end tests start, if any test in "$@" is one (the unit tests start nothing;
# task_exception_test starts only spdld: PROGRAMS in tests/CMakeLists.txt).
tools_for() {
  case " $* " in
    *" all "*|*e2e*|*bad_data*|*security*|*limits*|*faults*|*soak*) echo "${tools[@]}" ;;
    *task_exception*) echo spdld ;;
  esac
}

# A ctest -R regex for whole test executables (ctest names are "EXECUTABLE/TEST CASE").
test_regex() { echo "^($(IFS='|'; echo "$*"))/"; }

failed=0
check_reports() {  # DIR PART
  local found
  found=$(reports "$1")
  if [ -n "$found" ]; then
    echo "sanitize: $2: sanitizer reports in $1/Testing/Temporary/LastTest.log:"
    echo "$found" | head -n 50
    failed=1
  else
    echo "sanitize: $2: no sanitizer reports"
  fi
}

for part in "${parts[@]}"; do
  case "$part" in
    asan)
      echo "sanitize: asan: building ${asan_tests[*]} in $asan_dir (address,undefined; $asan_build)"
      timed "asan configure" configure "$asan_dir" address,undefined || failed=1
      if [ "${asan_tests[*]}" = all ]; then
        timed "asan build" cmake --build "$asan_dir" -j "$jobs" || failed=1
        timed "asan ctest" run_ctest "$asan_dir" || failed=1
      else
        timed "asan build" cmake --build "$asan_dir" -j "$jobs" --target "${asan_tests[@]}" $(tools_for "${asan_tests[@]}") || failed=1
        timed "asan ctest" run_ctest "$asan_dir" -R "$(test_regex "${asan_tests[@]}")" || failed=1
      fi
      check_reports "$asan_dir" asan
      ;;
    tsan)
      echo "sanitize: tsan: building ${tsan_tests[*]} in $tsan_dir (thread)"
      timed "tsan configure" configure "$tsan_dir" thread || failed=1
      timed "tsan build" cmake --build "$tsan_dir" -j "$jobs" --target "${tsan_tests[@]}" $(tools_for "${tsan_tests[@]}") || failed=1
      timed "tsan ctest" run_ctest "$tsan_dir" -R "$(test_regex "${tsan_tests[@]}")" || failed=1
      check_reports "$tsan_dir" tsan
      ;;
    *)
      echo "usage: $0 [asan] [tsan]" >&2
      exit 2
      ;;
  esac
done

echo "sanitize: times on $(nproc) cores (wall, CPU user+sys, exit status, load average before -> after):"
for t in "${timings[@]}"; do echo "  $t"; done
[ "$failed" -eq 0 ] && echo "sanitize: OK" || echo "sanitize: FAILED"
exit "$failed"
