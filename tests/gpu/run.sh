#!/usr/bin/env bash
# GPU delivery and GPU JPEG decode on a machine with a CUDA device: configures and builds with CUDA
# on, runs every [gpu] test — the runtime-level cases (gpu_test), the end-to-end case through the
# real spdld and 2 real client processes (gpu_daemon_test), nvJPEG + the resize kernels against
# the CPU path (nvjpeg_test, when nvJPEG's header was found: scripts/install-deps.sh), and the
# Python binding with torch when the build has it — plus the fake-backend unit tests, then prints
# the H2D bandwidth figure (pageable vs pinned) and the CPU vs GPU decode bench (samples/s, host CPU
# per sample, same files). On a real device it regenerates bench/GPU_RESULTS.md from this run's
# output (device, driver, CUDA version, every figure line); never edit that file by hand.
# On a fresh machine it first installs what is missing (scripts/install-deps.sh test, as root or
# with sudo; not fatal on a machine without a package mirror: what needs a missing piece says so),
# and, on a machine with a GPU, a CUDA-enabled torch from PyPI into a venv for the torch test
# (Debian's torch is CPU-only; without PyPI that test says SKIPPED). Under 5 minutes on a GPU machine
# once installed. Without a device it builds, runs every host-side part, says clearly that there is
# no device, leaves bench/GPU_RESULTS.md alone, and exits 0.
#
#   tests/gpu/run.sh [--dry-run] [--no-install] [BUILD_DIR]   (default BUILD_DIR: build-gpu)
#
# --dry-run: for a machine without a GPU (checking this script): installs nothing, builds, runs
# every part that needs no device (the fake-device tests, the [gpu] binaries, which skip), then
# checks that every binary the device steps would run is built and writes the results file from
# this run's log to BUILD_DIR/GPU_RESULTS.dry-run.md instead of bench/GPU_RESULTS.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DRY=0
INSTALL=1
BUILD=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1; INSTALL=0 ;;
    --no-install) INSTALL=0 ;;
    -h | --help) sed -n '2,30p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "run.sh: unknown option $arg" >&2; exit 2 ;;
    *) BUILD="$arg" ;;
  esac
done
BUILD="${BUILD:-$ROOT/build-gpu}"
case "$BUILD" in /*) ;; *) BUILD="$PWD/$BUILD" ;; esac
JOBS="$(nproc 2>/dev/null || echo 2)"
mkdir -p "$BUILD"
LOG="$BUILD/gpu-run.log"
# Everything below also goes to $LOG, from which bench/GPU_RESULTS.md is made.
exec > >(tee "$LOG") 2>&1

have_gpu_listed() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }

if [ "$INSTALL" -eq 1 ]; then
  echo "== install what is missing (scripts/install-deps.sh test)"
  timeout 2400 "$ROOT/scripts/install-deps.sh" test \
    || echo "== WARNING: scripts/install-deps.sh failed (no package mirror?); going on with what is there"
else
  echo "== install: skipped ($([ "$DRY" -eq 1 ] && echo --dry-run || echo --no-install))"
fi
for tool in cmake ninja c++ nvcc; do
  if ! command -v "$tool" >/dev/null 2>&1 && ! { [ "$tool" = nvcc ] && [ -x /usr/local/cuda/bin/nvcc ]; }; then
    echo "== FAIL: $tool is missing (scripts/install-deps.sh; the CUDA 13 toolkit for nvcc)"
    exit 1
  fi
done
command -v nvcc >/dev/null 2>&1 || export PATH="/usr/local/cuda/bin:$PATH"

# The torch test needs a CUDA-enabled torch: Debian's is CPU-only. On a GPU machine, one from PyPI
# into a venv that sees the system's packages (pytest, numpy), unless the system's has CUDA already.
PYBIN=/usr/bin/python3
if [ "$INSTALL" -eq 1 ] && have_gpu_listed; then
  if ! /usr/bin/python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    VENV="$BUILD/torch-cuda-venv"
    echo "== a CUDA-enabled torch from PyPI into $VENV"
    if { [ -x "$VENV/bin/python3" ] || /usr/bin/python3 -m venv --system-site-packages "$VENV"; } &&
      timeout 1200 "$VENV/bin/python3" -m pip install -q torch; then
      PYBIN="$VENV/bin/python3"
    else
      echo "== WARNING: no CUDA-enabled torch (PyPI unreachable?): the torch test will say SKIPPED"
    fi
  fi
fi

echo "== configure ($BUILD, CUDA on)"
PY=(); [ -x /usr/bin/python3 ] && PY=(-DPython3_EXECUTABLE=/usr/bin/python3)
# all-major: the spin kernel runs on whatever GPU the machine has (not only sm_80 / sm_90).
# SPDL_NVJPEG_ROOT: where nvidia-nvjpeg is unpacked, when not /opt/spdld-nvjpeg (install-deps.sh's
# place), e.g. a copy carried into the tree for a machine without PyPI:
#   /usr/bin/python3 -m pip install --no-deps --target build-deps/nvjpeg nvidia-nvjpeg==13.0.4.44
#   SPDL_NVJPEG_ROOT=$PWD/build-deps/nvjpeg tests/gpu/run.sh
NVJ=(); [ -n "${SPDL_NVJPEG_ROOT:-}" ] && NVJ=(-DSPDL_NVJPEG_ROOT="$SPDL_NVJPEG_ROOT")
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DSPDL_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CUDA_ARCHITECTURES=all-major "${PY[@]}" "${NVJ[@]}" >/dev/null
echo "== build"
# (The target list is read first: `ninja -t targets | grep -q` under pipefail fails when grep
# stops reading early, which silently dropped the Python module.)
TARGETS="$(ninja -C "$BUILD" -t targets all 2>/dev/null || true)"
PYMOD=""
if grep -q '^spdl_python:' <<<"$TARGETS"; then PYMOD=spdl_python; fi
DECODE=""
if grep -q '^nvjpeg_test:' <<<"$TARGETS"; then DECODE="nvjpeg_test spdl-gpu-decode-bench"; fi
timeout 1800 ninja -C "$BUILD" -j "$JOBS" spdld gpu_test gpu_daemon_test spdl-gpu-consumer spdl-h2d-bandwidth \
  cuda_test gpu_decode_test gpu_e2e_test spdl-make-dataset $PYMOD $DECODE

echo "== fake-backend unit tests (host logic)"
timeout 300 "$BUILD/bin/cuda_test"
timeout 300 "$BUILD/bin/gpu_decode_test"
echo "== the GPU protocol and GPU decode through spdld on the fake device"
timeout 300 "$BUILD/bin/gpu_e2e_test"

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true
fi
echo "== [gpu] tests"
# Exit 77: every case skipped (no device; tests/skip.h), any other non-zero: a failure.
rc=0
OUT="$(timeout 300 "$BUILD/bin/gpu_test" "[gpu]" 2>&1)" || rc=$?
echo "$OUT"
[ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || exit 1
echo "== [gpu] end to end through spdld"
rc2=0
OUT2="$(timeout 240 "$BUILD/bin/gpu_daemon_test" "[gpu]" 2>&1)" || rc2=$?
echo "$OUT2"
[ "$rc2" -eq 0 ] || [ "$rc2" -eq 77 ] || exit 1
rc3=77
if [ -n "$DECODE" ]; then
  echo "== [gpu] nvJPEG decode + kernels vs the CPU path"
  rc3=0
  OUT3="$(timeout 300 "$BUILD/bin/nvjpeg_test" "[gpu]" 2>&1)" || rc3=$?
  echo "$OUT3"
  [ "$rc3" -eq 0 ] || [ "$rc3" -eq 77 ] || exit 1
else
  echo "== [gpu] nvJPEG decode: NOT BUILT (no nvjpeg.h; scripts/install-deps.sh installs nvidia-nvjpeg)"
fi
if [ -d "$BUILD/python/spdl_client" ] && "$PYBIN" -c "import torch" 2>/dev/null; then
  echo "== Python: torch.from_dlpack of cuda jobs"
  SPDL_BUILD_DIR="$BUILD" PYTHONPATH="$BUILD/python" timeout 120 "$PYBIN" -m pytest -q -rs \
    "$ROOT/tests/python/test_gpu.py" || exit 1
fi
if [ "$rc" -eq 77 ] && have_gpu_listed; then
  # nvidia-smi sees GPUs but CUDA could not use them (a driver too old for CUDA 13, a broken
  # install): that is a failure, not "no device".
  echo "== FAIL: nvidia-smi lists GPUs but the [gpu] tests found no usable CUDA device:"
  echo "$OUT" | grep -i -m3 -E 'driver|cuda' || true
  exit 1
fi
if [ "$rc" -eq 77 ]; then
  echo "== NO CUDA DEVICE on this machine: the [gpu] tests were built but skipped (not run)."
  timeout 60 "$BUILD/bin/spdl-h2d-bandwidth" || true
  if [ -n "$DECODE" ]; then
    echo "== CPU vs GPU decode bench (CPU side only here)"
    timeout 120 "$BUILD/bin/spdl-gpu-decode-bench" 64 16 || exit 1
  fi
  echo "== bench/GPU_RESULTS.md left as it is (it comes from a run on a real device)"
  if [ "$DRY" -eq 0 ]; then exit 0; fi
  echo "== (dry run) the device steps: their binaries"
  missing=0
  for b in spdl-h2d-bandwidth gpu_test gpu_daemon_test spdl-gpu-consumer ${DECODE}; do
    if [ -x "$BUILD/bin/$b" ]; then echo "   built: $b"; else echo "   MISSING: $b"; missing=1; fi
  done
  [ "$missing" -eq 0 ] || exit 1
fi
if [ "$DRY" -eq 0 ] && [ -n "$DECODE" ] && [ "$rc3" -eq 77 ]; then
  echo "== FAIL: a CUDA device is there but the nvJPEG tests skipped (nvJPEG not loadable?):"
  echo "$OUT3" | grep -i -m3 -E 'nvjpeg|skip' || true
  exit 1
fi
if [ "$DRY" -eq 0 ]; then
  echo "== [gpu] tests passed on a real device"
  echo "== H2D bandwidth"
  timeout 120 "$BUILD/bin/spdl-h2d-bandwidth" 256 8
  if [ -n "$DECODE" ]; then
    echo "== CPU vs GPU decode bench (same files)"
    timeout 300 "$BUILD/bin/spdl-gpu-decode-bench" 1024 64
  fi
fi

# bench/GPU_RESULTS.md, regenerated from this run's output (a dry run writes beside the log).
RESULTS="$ROOT/bench/GPU_RESULTS.md"
[ "$DRY" -eq 1 ] && RESULTS="$BUILD/GPU_RESULTS.dry-run.md"
{
  echo "# GPU results (generated by tests/gpu/run.sh; do not edit by hand)"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/- device: /'
  fi
  nvcc_version="$( (command -v nvcc || echo /usr/local/cuda/bin/nvcc) | xargs -I{} sh -c '{} --version 2>/dev/null' | grep -o 'release [0-9.]*' || true)"
  echo "- CUDA toolkit: ${nvcc_version:-unknown}"
  echo
  echo "## [gpu] tests"
  echo
  echo '```'
  grep -E '^(All tests passed|test cases:|assertions:)|SKIPPED|FAILED' "$LOG" || true
  echo '```'
  echo
  echo "## Figures"
  echo
  echo '```'
  grep -E '^ *(pageable|pinned|H2D|daemon path|ipc|nvjpeg|decode-bench|gpu decode vs cpu)' "$LOG" || true
  echo '```'
} > "$RESULTS"
echo "== wrote $RESULTS"
