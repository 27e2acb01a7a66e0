#!/usr/bin/env bash
# Installs the Debian packages spdld needs to build, test, run the demo and the benchmark — only
# those that are missing, so it is quick when everything is there. Needs root (or sudo).
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build pkg-config
  # libraries the daemon and the client are made of
  libboost-dev libavcodec-dev libavformat-dev libavutil-dev libswscale-dev libswresample-dev
  libturbojpeg0-dev libjpeg62-turbo-dev libspdlog-dev libcli11-dev libyaml-cpp-dev
  libprotobuf-dev protobuf-compiler nlohmann-json3-dev libcurl4-openssl-dev
  libsystemd-dev
  # tests
  catch2 ffmpeg python3-prometheus-client
  # the Python client, its tests and the benchmark (Debian's python3 has torch)
  python3-dev pybind11-dev libdlpack-dev python3-pytest python3-numpy python3-torch
  python3-torchvision python3-pil python3-psutil python3-matplotlib
  # spdl_client reads a YAML config's output.device; scripts/test-wheel.sh builds the wheel in venvs
  python3-yaml python3-venv python3-pip
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
