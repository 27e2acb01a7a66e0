#!/usr/bin/env bash
# Installs the Debian packages (and the few PyPI tools) spdld needs for one purpose — only those
# that are missing, so it is quick when everything is there. Needs root (or sudo).
#
#   scripts/install-deps.sh demo    build + the daemon's and client's libraries: `make demo`
#   scripts/install-deps.sh test    demo's, then the test stack (Python client, pytest, torch, ffmpeg,
#                                   promtool, systemd-analyze, ...): `make test`
#   scripts/install-deps.sh bench   test's, then the benchmark's plots: `make bench`
#   scripts/install-deps.sh all     everything (the default)
#
# One array per purpose: add a package to the array of what needs it (measured fresh-machine
# times per purpose: README.md, "Quick start").
set -euo pipefail

# build: compiler and tools; catch2 (header-only, ~1 MB) because the build configures the tests.
build=(
  build-essential cmake ninja-build pkg-config catch2
)
# the libraries the daemon, spdlctl, spdl-client and the C++ client library are made of
libs=(
  libboost-dev libavcodec-dev libavformat-dev libavutil-dev libswscale-dev libswresample-dev
  libturbojpeg0-dev libjpeg62-turbo-dev libspdlog-dev libcli11-dev libyaml-cpp-dev
  libprotobuf-dev protobuf-compiler nlohmann-json3-dev libcurl4-openssl-dev libssl-dev
  libsystemd-dev
)
# tests: the Python client (python3-dev, pybind11, dlpack) and its tests (torch, numpy, PIL),
# the media tests' `ffmpeg`, the metrics checks (prometheus-client, promtool from `prometheus`),
# the unit checks (`systemd` for systemd-analyze, systemd-sysusers, systemd-tmpfiles), python3-venv
# for the test tools' venv (pip_test below: kubernetes-validate, clang-tidy), clang-format for the
# format check of `make test` (scripts/format.sh), ccache for the compiles of `make test` and
# `make ci-release` (the Makefile uses it when it is there; CI's release build takes most of its
# objects from the test build's through it)
test=(
  ffmpeg python3-prometheus-client prometheus systemd python3-venv python3-pip python3-yaml
  python3-dev pybind11-dev libdlpack-dev python3-pytest python3-numpy python3-torch
  python3-torchvision python3-pil python3-psutil clang-format ccache
)
# the benchmark against PyTorch's DataLoader: test's Python stack, and its plots
bench=(
  python3-matplotlib
)
# PyPI tools for the tests, installed into $SPDL_TOOLS_VENV (default /opt/spdld-test-tools):
# kubernetes-validate checks deploy/kubernetes against the Kubernetes schemas it carries;
# clang-tidy (a manylinux wheel carrying the binary and its builtin headers; runs on Debian 12's
# glibc 2.36) for `make lint` / `make ci-lint` (scripts/lint.sh finds it there). Not Debian's
# clang-tidy 14: it runs its matchers over the system headers too, so it costs twice the CPU per file
# (7.3 s vs 3.4 s on daemon/jobs/targets.cc), the whole tree ~13 min on 2 cores. Pinned (NAME==VERSION
# is installed again when another version is there) so that a new release cannot bring new findings
# under us: moving to a newer one is a change of its own, with its findings fixed.
pip_test=(
  kubernetes-validate
  clang-tidy==23.1.4
)
# PyPI packages the Python tests import from Debian's /usr/bin/python3 itself (the interpreter the
# tests run under), installed next to Debian's packages with Debian's numpy pinned, so that pip never
# replaces it: JAX's CPU wheels (tests/python/test_jax.py, client/python/examples/jax_example.py;
# numpy 1.24 -> jax 0.4.38; ~1.5 min, ~110 MB) and moto[server], the S3 server tests/python/test_s3.py
# starts on 127.0.0.1. TensorFlow is not installed (~600 MB): its test says SKIPPED without it.
pip_system_test=(
  "jax[cpu]"
  "moto[server]"
)

# nvJPEG (GPU JPEG decode, decode.device: cuda): not in the CUDA toolkit, so its header and library
# come from NVIDIA's PyPI wheel, unpacked into $SPDL_NVJPEG_ROOT (default /opt/spdld-nvjpeg; CMake
# looks there). spdld never links it: it loads libnvjpeg.so.13 at run time, only for such jobs. The
# version matches the CUDA 13.0 toolkit the build uses.
nvjpeg_wheel="nvidia-nvjpeg==13.0.4.44"

purpose=${1:-all}
case "$purpose" in
  demo | build) packages=("${build[@]}" "${libs[@]}") ;;
  test) packages=("${build[@]}" "${libs[@]}" "${test[@]}") ;;
  bench | all) packages=("${build[@]}" "${libs[@]}" "${test[@]}" "${bench[@]}") ;;
  *) echo "usage: $0 [demo|test|bench|all]" >&2; exit 2 ;;
esac

sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps ($purpose): all ${#packages[@]} packages present"
else
  echo "install-deps ($purpose): installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ "$purpose" != demo ] && [ "$purpose" != build ]; then
  venv=${SPDL_TOOLS_VENV:-/opt/spdld-test-tools}
  need=()
  for p in "${pip_test[@]}"; do
    have=$("$venv/bin/python3" -m pip show "${p%%==*}" 2>/dev/null | sed -n 's/^Version: //p' || true)
    if [ -z "$have" ] || { [ "$p" != "${p%%==*}" ] && [ "$have" != "${p#*==}" ]; }; then need+=("$p"); fi
  done
  if [ ${#need[@]} -gt 0 ]; then
    echo "install-deps ($purpose): installing ${need[*]} into $venv"
    [ -x "$venv/bin/python3" ] || $sudo /usr/bin/python3 -m venv "$venv"
    # Not fatal: without PyPI the tests that need these say "SKIPPED" (ctest: Skipped); without
    # clang-tidy, `make lint` says it is missing and fails.
    $sudo "$venv/bin/python3" -m pip install -q "${need[@]}" \
      || echo "install-deps ($purpose): WARNING: could not install ${need[*]} from PyPI; their tests will be skipped (make lint: no clang-tidy)" >&2
  fi
fi

if [ "$purpose" != demo ] && [ "$purpose" != build ]; then
  need=()
  for p in "${pip_system_test[@]}"; do
    /usr/bin/python3 -m pip show -q "${p%%[*}" >/dev/null 2>&1 || need+=("$p")
  done
  if [ ${#need[@]} -gt 0 ]; then
    numpy_version=$(/usr/bin/python3 -c "import numpy; print(numpy.__version__)")
    echo "install-deps ($purpose): installing ${need[*]} for /usr/bin/python3 (numpy==$numpy_version kept)"
    # Not fatal: without PyPI the tests that need these say "SKIPPED".
    $sudo /usr/bin/python3 -m pip install -q --break-system-packages "numpy==$numpy_version" "${need[@]}" \
      || echo "install-deps ($purpose): WARNING: could not install ${need[*]} from PyPI; their tests will be skipped" >&2
  fi
fi

if [ "$purpose" != demo ] && [ "$purpose" != build ]; then
  nvjpeg_root=${SPDL_NVJPEG_ROOT:-/opt/spdld-nvjpeg}
  if [ ! -f "$nvjpeg_root/nvidia/cu13/include/nvjpeg.h" ]; then
    echo "install-deps ($purpose): installing $nvjpeg_wheel into $nvjpeg_root (header + libnvjpeg.so.13)"
    # Not fatal: without it a CUDA build has no nvJPEG decode path (its [gpu] tests say SKIPPED).
    $sudo /usr/bin/python3 -m pip install -q --no-deps --target "$nvjpeg_root" "$nvjpeg_wheel" \
      || echo "install-deps ($purpose): WARNING: could not install $nvjpeg_wheel; no GPU JPEG decode in CUDA builds" >&2
  fi
fi
