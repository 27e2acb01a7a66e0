#!/usr/bin/env bash
# deploy/docker/Dockerfile, checked without pulling an image (no registry here): Debian 12 bases,
# every COPY source present in the repository, the install-deps purpose it calls defined, the .deb
# from this repository's CPack installed, and the spdld uid/gid the Kubernetes manifests run as.
set -uo pipefail
src_dir=$(cd "$(dirname "$0")/../.." && pwd)
df=$src_dir/deploy/docker/Dockerfile
fail() { echo "FAIL: $*"; exit 1; }
grep -qE "^FROM debian:12 AS build$" "$df" || fail "the build stage is not FROM debian:12"
grep -qE "^FROM debian:12-slim$" "$df" || fail "the runtime stage is not FROM debian:12-slim"
grep -E "^COPY " "$df" | grep -v -- "--from=" | while read -r _ srcs; do
  for s in ${srcs% *}; do
    [ "$s" = . ] || [ -e "$src_dir/$s" ] || { echo "FAIL: COPY $s: not in the repository"; exit 1; }
  done
done || exit 1
purpose=$(grep -o "&& scripts/install-deps.sh [a-z]*" "$df" | head -1 | awk '{print $3}')
grep -qE "^  $purpose( |\))" "$src_dir/scripts/install-deps.sh" || fail "install-deps.sh has no purpose '$purpose'"
grep -q "cpack -G DEB" "$df" && grep -q "apt-get install .*/tmp/spdld_\*.deb" "$df" || fail "the image does not install the repository's .deb"
uid=$(grep -o "useradd --system --uid [0-9]*" "$df" | awk '{print $4}')
k8s_uid=$(grep -o "runAsUser: [0-9]*" "$src_dir/deploy/kubernetes/base/daemonset.yaml" | head -1 | awk '{print $2}')
[ -n "$uid" ] && [ "$uid" = "$k8s_uid" ] || fail "image uid $uid != the DaemonSet's runAsUser $k8s_uid"
grep -q "install -d -o $uid -g $uid" "$src_dir/deploy/kubernetes/base/daemonset.yaml" || fail "the init container does not chown the socket dir to $uid"
echo "OK: Dockerfile consistent (not built here: no image registry reachable)"
