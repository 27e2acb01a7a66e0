#!/usr/bin/env bash
# deploy/slurm/spdld-node.sh as a Slurm job would run it, without Slurm: `run` starts the real spdld
# as this user on a job-private socket, `wait` sees it listen, a real spdl-client job runs through
# it, `stop` drains it and `run` exits cleanly, removing its socket directory. Also checks that
# train.sbatch parses (bash -n). Usage: slurm_node_test.sh BUILD_DIR
set -uo pipefail
build_dir=$1
src_dir=$(cd "$(dirname "$0")/../.." && pwd)
run_pid=""
tmp=$(mktemp -d); trap '[ -n "$run_pid" ] && kill $run_pid 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
bash -n "$src_dir/deploy/slurm/train.sbatch" || fail "train.sbatch does not parse"

export SLURM_JOB_ID=t$$ SPDL_BIN=$build_dir/bin SPDL_DATA=$tmp/data SPDLD_SOCKET=$tmp/job/spdld.sock
"$SPDL_BIN/spdl-make-dataset" "$SPDL_DATA" --classes 2 --per-class 8 --min-side 64 --max-side 96 >/dev/null || fail "spdl-make-dataset"
"$src_dir/deploy/slurm/spdld-node.sh" run > "$tmp/run.log" 2>&1 &
run_pid=$!
"$src_dir/deploy/slurm/spdld-node.sh" wait || { cat "$tmp/run.log"; fail "spdld-node.sh wait"; }
[ "$(stat -c %a "$tmp/job")" = 700 ] || fail "the socket directory is not private (0700)"
out=$("$SPDL_BIN/spdl-client" --socket "$SPDLD_SOCKET" --config "$src_dir/config/examples/imagenet.yaml" \
        --set source.root="$SPDL_DATA" --set batch.size=4 --epochs 1 --json) || fail "spdl-client through the job's daemon"
echo "$out" | grep -q '"samples": *16' || fail "expected 16 samples: $out"
"$src_dir/deploy/slurm/spdld-node.sh" stop >/dev/null || fail "spdld-node.sh stop"
for _ in $(seq 1 200); do kill -0 $run_pid 2>/dev/null || break; sleep 0.1; done
wait $run_pid; rc=$?
cat "$tmp/run.log"
[ $rc -eq 0 ] || fail "spdld-node.sh run exited $rc"
[ ! -e "$tmp/job" ] || fail "the socket directory was left behind"
echo "OK: spdld-node.sh run / wait / stop around a real job"
