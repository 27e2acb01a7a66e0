#!/usr/bin/env bash
# GPU delivery on a machine with a CUDA device: configures and builds with CUDA on, runs every
# [gpu] test (and the fake-backend unit tests), then prints the H2D bandwidth figure (pageable vs
# pinned). Under 5 minutes on a GPU machine. Without a device it builds, says clearly that there is
# no device, and exits 0.
#
#   tests/gpu/run.sh [BUILD_DIR]     (default: build-gpu at the top of the repository)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-$ROOT/build-gpu}"
JOBS="$(nproc 2>/dev/null || echo 2)"

echo "== configure ($BUILD, CUDA on)"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DSPDL_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
echo "== build"
ninja -C "$BUILD" -j "$JOBS" gpu_test spdl-gpu-consumer spdl-h2d-bandwidth cuda_test

echo "== fake-backend unit tests (host logic)"
"$BUILD/bin/cuda_test"

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true
fi
echo "== [gpu] tests"
OUT="$("$BUILD/bin/gpu_test" "[gpu]" 2>&1)" || { echo "$OUT"; exit 1; }
echo "$OUT"
if grep -q "skipped: no CUDA device" <<<"$OUT"; then
  echo "== NO CUDA DEVICE on this machine: the [gpu] tests were built but skipped (not run)."
  "$BUILD/bin/spdl-h2d-bandwidth"
  exit 0
fi
echo "== [gpu] tests passed on a real device"

echo "== H2D bandwidth"
timeout 120 "$BUILD/bin/spdl-h2d-bandwidth" 256 8
