#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang, ASan and UBSan, and runs each for SECONDS
# (default 60) on a fresh copy of its seed corpus. Exits non-zero if any target finds a crash, a
# leak, a timeout, an allocation over its limit or a broken invariant; the input that did it is
# kept under $FUZZ_BUILD_DIR/artifacts/<target>/ (copy it to tests/fuzz/crashes/<target>/ to
# report it).
#
#   scripts/fuzz.sh [SECONDS]
#   FUZZ_BUILD_DIR=build-fuzz   where to build (a separate clang build; default build-fuzz)
#   FUZZ_TARGETS="control_fuzz config_fuzz:20 ..."   which targets to run, each for SECONDS or
#                               for its own :N seconds (default: all eight)
#   FUZZ_ARGS="-max_len=8192"   extra libFuzzer flags for every target
#   JOBS=N                      build parallelism (default nproc)
#   FUZZ_PARALLEL=N             targets fuzzed at once (default JOBS; each is one process on one
#                               core, so N targets of S seconds take about ceil(count / N) * S)
#   FUZZ_WITH_TESTS=1           configure the whole project instead (cmake -C
#                               cmake/clang-asan-fuzz.cmake: SPDL_FUZZ=ON, tests on), so that the
#                               same build directory then builds the ASan+UBSan unit tests from the
#                               same instrumented libraries (CI: make ci-fuzz, then make ci-sanitize
#                               with SANITIZE_ASAN_BUILD=fuzz); only the fuzz targets are built here
#
# Per-target flags (below): dictionaries for tar and http; the media targets run with
# -malloc_limit_mb=512 (what a decoder may allocate by design is bounded by the target's
# max_pixels / durations, far below that: a larger allocation is a finding) and a longer -timeout.
#
# Reproduce a finding: $FUZZ_BUILD_DIR/bin/<target> FILE   (FUZZ_TRACE=1 prints what each input
# came to; control_fuzz: CONTROL_FUZZ_TRACE=1 prints the frames in and the messages out).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
build_dir="${FUZZ_BUILD_DIR:-build-fuzz}"
specs=(${FUZZ_TARGETS:-control_fuzz config_fuzz resume_fuzz tar_fuzz image_fuzz audio_fuzz video_fuzz http_fuzz})
targets=()
for spec in "${specs[@]}"; do targets+=("${spec%%:*}"); done
jobs="${JOBS:-$(nproc)}"

# ---- clang with libFuzzer (Debian: clang, libclang-rt-14-dev) ----
need_clang() {
  ! command -v clang >/dev/null || ! command -v clang++ >/dev/null || ! echo \
    'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    clang++ -x c++ -fsanitize=fuzzer,address,undefined - -o /dev/null 2>/dev/null
}
if need_clang; then
  echo "fuzz: installing clang and libFuzzer (clang libclang-rt-14-dev)"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends clang libclang-rt-14-dev
fi

# ---- build ----
t0=$(date +%s)
if [ -n "${FUZZ_WITH_TESTS:-}" ]; then
  cmake -S . -B "$build_dir" -G Ninja -C cmake/clang-asan-fuzz.cmake >/dev/null
else
  cmake -S tests/fuzz -B "$build_dir" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
fi
build_targets=("${targets[@]}")
[[ " ${targets[*]} " == *" control_fuzz "* ]] && build_targets+=(make_control_corpus)
cmake --build "$build_dir" -j "$jobs" --target "${build_targets[@]}"
echo "fuzz: build took $(( $(date +%s) - t0 ))s"

# ---- run ----
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# One target: fuzz it and write its summary line to logs/TARGET.summary (and, when it failed, the
# end of its log to logs/TARGET.failure).
fuzz_one() {
  local spec="$1" target secs name corpus artifacts log extra started rc took status_line execs cov ft corp rate \
    verdict crash
  target="${spec%%:*}"
  secs="$seconds"
  [[ "$spec" == *:* ]] && secs="${spec##*:}"
  name="${target%_fuzz}"
  corpus="$build_dir/corpus/$name"
  artifacts="$build_dir/artifacts/$name"
  log="$build_dir/logs/$target.log"
  rm -rf "$corpus"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  cp tests/fuzz/corpus/"$name"/* "$corpus"/
  extra=(-timeout=10)
  case "$target" in
    control_fuzz)
      "$build_dir"/bin/make_control_corpus "$corpus" >/dev/null  # seeds that track control.proto
      ;;
    config_fuzz)
      # Every example config, as checked in now.
      find config -name '*.yaml' | while read -r f; do cp "$f" "$corpus/example_$(echo "$f" | tr / _)"; done
      extra+=(-dict=tests/fuzz/config.dict)
      ;;
    tar_fuzz)
      extra+=(-dict=tests/fuzz/tar.dict -max_len=65536)
      ;;
    http_fuzz)
      extra+=(-dict=tests/fuzz/http.dict -max_len=8192)
      ;;
    image_fuzz | audio_fuzz | video_fuzz)
      extra=(-timeout=30 -rss_limit_mb=2048 -malloc_limit_mb=512)
      ;;
  esac
  echo "fuzz: running $target for ${secs}s (log: $log)"
  started=$(date +%s)
  set +e
  "$build_dir/bin/$target" "$corpus" -max_total_time="$secs" -detect_leaks=1 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "${extra[@]}" ${FUZZ_ARGS:-} >"$log" 2>&1
  rc=$?
  set -e
  took=$(( $(date +%s) - started ))
  # The last status line: "#N  DONE  cov: C ft: F corp: K/SIZE ... exec/s: E rss: R".
  status_line=$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)
  execs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || true)
  [ -z "$execs" ] && execs=$(echo "$status_line" | grep -oE '^#[0-9]+' | tr -d '#')
  cov=$(echo "$status_line" | grep -oE 'cov: [0-9]+' | grep -oE '[0-9]+' || true)
  ft=$(echo "$status_line" | grep -oE 'ft: [0-9]+' | grep -oE '[0-9]+' || true)
  corp=$(echo "$status_line" | grep -oE 'corp: [0-9]+' | grep -oE '[0-9]+' || true)
  rate=$(echo "$status_line" | grep -oE 'exec/s: [0-9]+' | grep -oE '[0-9]+' || true)
  if [ "$rc" -eq 0 ]; then
    verdict="ok"
  else
    verdict="FAILED (exit $rc)"
    crash=$(grep -oE "Test unit written to [^ ]+" "$log" | tail -n 1 | sed 's/Test unit written to //' || true)
    [ -n "$crash" ] && verdict="$verdict input: $crash"
    {
      echo "---- $target: the end of $log ----"
      grep -E 'ERROR|invariant failed|SUMMARY|#[0-9]+ 0x' "$log" | head -n 30 || true
      echo "----"
    } >"$build_dir/logs/$target.failure"
  fi
  echo "$target: $verdict, ${execs:-0} executions (${rate:-?}/s), coverage ${cov:-?} edges, ${ft:-?} features, corpus ${corp:-?} inputs, ${took}s of ${secs}s" \
    >"$build_dir/logs/$target.summary"
}

parallel="${FUZZ_PARALLEL:-$jobs}"
mkdir -p "$build_dir/logs"
rm -f "$build_dir"/logs/*.summary "$build_dir"/logs/*.failure
for spec in "${specs[@]}"; do
  fuzz_one "$spec" &
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n || true; done
done
wait
summary=()
failed=0
for target in "${targets[@]}"; do
  if [ -f "$build_dir/logs/$target.failure" ]; then
    cat "$build_dir/logs/$target.failure"
    failed=1
  fi
  if [ -f "$build_dir/logs/$target.summary" ]; then
    summary+=("$(cat "$build_dir/logs/$target.summary")")
  else
    summary+=("$target: FAILED (no result)")
    failed=1
  fi
done

echo "fuzz summary:"
for line in "${summary[@]}"; do echo "  $line"; done
exit "$failed"
