#!/usr/bin/env bash
# The shipped-artifact check (CI: `make ci-release`): builds what ships — spdld, spdlctl,
# spdl-client, spdl-make-dataset and the Python module — as a Release build without test seams
# (-DSPDL_TEST_HOOKS=OFF -DSPDL_BUILD_TESTS=OFF, CUDA as found) in its own directory, then checks
# with tests/shipped/check_artifacts.sh that none of them carries a test seam ("test-only" text,
# a fake GPU backend symbol, SPDL_TEST_FAKE_GPU_DIR, SPDLD_TEST_OPEN_GATE, the reference decode
# path, the test image encoders). Prints the wall time of the build and of the check.
#
#   scripts/release_check.sh            RELEASE_BUILD_DIR (default build-release), JOBS (default nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${RELEASE_BUILD_DIR:-build-release}"
jobs="${JOBS:-$(nproc)}"
py="${PYTHON:-/usr/bin/python3}"
t0=$SECONDS
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPDL_TEST_HOOKS=OFF -DSPDL_BUILD_TESTS=OFF \
  -DPython3_EXECUTABLE="$py" >/dev/null
targets=(spdld spdlctl spdl-client spdl-make-dataset)
grep -q '^build spdl_python:' "$dir/build.ninja" && targets+=(spdl_python)
cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
echo "release_check: built ${targets[*]} in $(( SECONDS - t0 ))s"
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
