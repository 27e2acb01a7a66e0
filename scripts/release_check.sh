#!/usr/bin/env bash
# The shipped-artifact check (CI: `make ci-release`): builds what ships — spdld, spdlctl,
# spdl-client, spdl-make-dataset and the Python module — as a Release build without test seams
# (-DSPDL_TEST_HOOKS=OFF -DSPDL_BUILD_TESTS=OFF, CUDA as found) in its own directory, then checks
# with tests/shipped/check_artifacts.sh that none of them carries a test seam ("test-only" text,
# a fake GPU backend symbol, SPDL_TEST_FAKE_GPU_DIR, SPDLD_TEST_OPEN_GATE, the reference decode
# path, the test image encoders). Prints the wall time of the build and of the check.
#
#   scripts/release_check.sh            RELEASE_BUILD_DIR (default build-release), JOBS (default nproc),
#                                       RELEASE_CMAKE_FLAGS (more cmake flags, e.g. -DSPDL_WERROR=ON
#                                       and ccache as CMAKE_<LANG>_COMPILER_LAUNCHER: make ci-release)
#
# With ccache as the compiler launcher it also prints how many of the build's compiles came from
# the cache (counted for this build alone, from ccache's stats log). In CI the test build is Release
# too, with the same warning flags, so that most objects are hits: only the sources that see
# SPDL_TEST_HOOKS compile again (.ci/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${RELEASE_BUILD_DIR:-build-release}"
jobs="${JOBS:-$(nproc)}"
py="${PYTHON:-/usr/bin/python3}"
read -r -a extra_flags <<<"${RELEASE_CMAKE_FLAGS:-}"
t0=$SECONDS
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPDL_TEST_HOOKS=OFF -DSPDL_BUILD_TESTS=OFF \
  -DPython3_EXECUTABLE="$py" "${extra_flags[@]}" >/dev/null
targets=(spdld spdlctl spdl-client spdl-make-dataset)
grep -q '^build spdl_python:' "$dir/build.ninja" && targets+=(spdl_python)
stats_log=""
if grep -q '^CMAKE_CXX_COMPILER_LAUNCHER:[A-Z]*=.*ccache' "$dir/CMakeCache.txt"; then
  stats_log="$PWD/$dir/ccache-stats.log"
  rm -f "$stats_log"
  export CCACHE_STATSLOG="$stats_log"
fi
cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
echo "release_check: built ${targets[*]} in $(( SECONDS - t0 ))s"
if [ -n "$stats_log" ] && [ -f "$stats_log" ]; then
  hits=$(grep -cE '^(direct|preprocessed)_cache_hit$' "$stats_log" || true)
  misses=$(grep -cx 'cache_miss' "$stats_log" || true)
  echo "release_check: ccache: $hits of $(( hits + misses )) compiles were cache hits ($misses compiled)"
fi
files=("$dir/bin/spdld" "$dir/bin/spdlctl" "$dir/bin/spdl-client" "$dir/bin/spdl-make-dataset")
for so in "$dir"/python/spdl_client/_spdl_client*.so; do
  [ -f "$so" ] && files+=("$so")
done
tests/shipped/check_artifacts.sh clean "${files[@]}"
# The hidden flag is gone, not just hidden: CLI11 calls it unexpected (a test build would ask for
# its value instead).
probe=$("$dir/bin/spdld" --test-only-fake-gpu 2>&1 || true)  # exits non-zero either way
if ! grep -q 'not expected: --test-only-fake-gpu' <<<"$probe"; then
  echo "FAIL: the Release spdld still knows --test-only-fake-gpu"
  exit 1
fi
echo "release_check: OK in $(( SECONDS - t0 ))s"
