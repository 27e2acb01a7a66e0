#!/usr/bin/env bash
# The demo: writes a small sample dataset of real JPEG files, starts spdld on a private socket,
# runs spdl-client on config/examples/imagenet.yaml for 2 epochs (throughput, time to first batch,
# per-epoch and per-stage figures), then stops the daemon with SIGTERM and checks it exited cleanly.
set -euo pipefail

build=${BUILD_DIR:-build}
bin="$build/bin"
work=$(mktemp -d /tmp/spdld-demo.XXXXXX)
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then kill -TERM "$daemon_pid"; wait "$daemon_pid" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "== writing a sample dataset (10 classes x 30 JPEG files of varied sizes) to $work/data"
"$bin/spdl-make-dataset" "$work/data" --classes 10 --per-class 30 --seed 1

echo "== starting spdld on $work/spdld.sock"
"$bin/spdld" --socket "$work/spdld.sock" --allow-root "$work" --log-level info &
daemon_pid=$!
for _ in $(seq 1 100); do [ -S "$work/spdld.sock" ] && break; sleep 0.05; done
[ -S "$work/spdld.sock" ] || { echo "spdld did not start"; exit 1; }

echo "== spdl-client: config/examples/imagenet.yaml, 2 epochs"
"$bin/spdl-client" --socket "$work/spdld.sock" --config config/examples/imagenet.yaml \
  --set source.root="$work/data" --epochs 2

echo "== stopping spdld (SIGTERM)"
kill -TERM "$daemon_pid"
status=0
wait "$daemon_pid" || status=$?
daemon_pid=""
if [ "$status" -ne 0 ]; then echo "spdld exited with status $status"; exit 1; fi
[ ! -e "$work/spdld.sock" ] || { echo "spdld left its socket file behind"; exit 1; }
echo "== done: spdld stopped cleanly"
