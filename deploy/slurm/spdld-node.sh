#!/usr/bin/env bash
# spdld for one Slurm job, one daemon per node, run as the job's user (no root, nothing installed
# system-wide needed): sbatch scripts start it with `srun --ntasks-per-node=1` (see train.sbatch).
#
#   spdld-node.sh run     start spdld on this node for the job, wait until it listens, keep it in
#                         the foreground (srun ... &); SIGTERM (scancel, the job's end) drains it
#   spdld-node.sh wait    wait (up to 60 s) until this node's daemon listens
#   spdld-node.sh stop    drain and stop this node's daemon (spdlctl drain)
#
# The socket: $SPDLD_SOCKET, default /tmp/spdld-$SLURM_JOB_ID/spdld.sock (a directory only the job's
# user may enter). Data: $SPDL_DATA (default /data), given as --allow-root. Programs: $SPDL_BIN
# (default /usr/bin, or build/bin of a checkout). Extra spdld options: $SPDLD_ARGS.
# On nodes that run spdld as a system service (systemd, group spdld), use that socket instead and
# skip this script.
set -euo pipefail
job=${SLURM_JOB_ID:?not inside a Slurm job (set SLURM_JOB_ID to try it by hand)}
socket=${SPDLD_SOCKET:-/tmp/spdld-$job/spdld.sock}
bin=${SPDL_BIN:-/usr/bin}
data=${SPDL_DATA:-/data}

wait_socket() {
  for _ in $(seq 1 600); do
    "$bin/spdlctl" status --socket "$socket" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "spdld-node: no spdld listening on $socket after 60 s" >&2
  return 1
}

case "${1:-}" in
  run)
    install -d -m 0700 "$(dirname "$socket")"
    # shellcheck disable=SC2086
    "$bin/spdld" --socket "$socket" --allow-root "$data" ${SPDLD_ARGS:-} &
    pid=$!
    # scancel / the job's end: pass SIGTERM on (spdld drains), then wait for it below.
    trap 'kill -TERM $pid 2>/dev/null || true' TERM INT
    wait_socket || { kill -TERM $pid 2>/dev/null || true; wait $pid || true; exit 1; }
    echo "spdld-node: spdld (pid $pid) on $(hostname) listens on $socket"
    rc=0
    wait $pid || rc=$?
    while kill -0 $pid 2>/dev/null; do  # a trapped signal ends `wait` early: wait for the drain
      rc=0
      wait $pid || rc=$?
    done
    rm -rf "$(dirname "$socket")"
    exit $rc
    ;;
  wait) wait_socket ;;
  stop) "$bin/spdlctl" drain --socket "$socket" ;;
  *) echo "usage: $0 run|wait|stop" >&2; exit 2 ;;
esac
