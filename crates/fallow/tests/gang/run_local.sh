#!/usr/bin/env bash
# Runs a gang script (allreduce.py, train.py) as WORLD local processes, each given by hand the
# environment a Fallow agent gives a replica of a gang (torchrun's names plus FALLOW_*): the
# reference "uninterrupted run" that gang tests compare against. Each rank's stdout and stderr are
# printed prefixed by `[rankN] `.
#
# Usage: run_local.sh WORLD SCRIPT [ARGS...]
# Environment (all optional):
#   PYTHON             the interpreter; default the first of /usr/bin/python3, python3 that imports torch
#   FALLOW_LOCAL_DIR   keeps rank N's FALLOW_CHECKPOINT_DIR at $FALLOW_LOCAL_DIR/rankN across runs
#                      (for resumption tests); default a temporary directory removed at exit
#   MASTER_PORT        default a free port;  FALLOW_GANG_EPOCH  default 1
# Exit: 0 when every rank exits 0, else the first non-zero status in rank order (137: killed).
# SIGINT or SIGTERM kills every rank with SIGKILL (a crash, as in a lost node) and exits 137.
set -euo pipefail

if [ $# -lt 2 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 WORLD SCRIPT [ARGS...]" >&2
  exit 2
fi
world=$1
script=$2
shift 2
[ -f "$script" ] || { echo "run_local: no script at $script" >&2; exit 2; }

if [ -z "${PYTHON:-}" ]; then
  for candidate in /usr/bin/python3 python3; do
    if "$candidate" -c 'import torch' 2>/dev/null; then PYTHON=$candidate; break; fi
  done
  [ -n "${PYTHON:-}" ] || { echo "run_local: no python3 here imports torch (apt-get install python3-torch)" >&2; exit 2; }
fi

run=$(mktemp -d)
checkpoints=${FALLOW_LOCAL_DIR:-$run}
port=${MASTER_PORT:-$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
peers=$(for ((rank = 0; rank < world; rank++)); do printf '127.0.0.1:%d\n' $((port + rank)); done | paste -sd,)

kill_ranks() {
  for pid_file in "$run"/rank*.pid; do
    [ -f "$pid_file" ] && kill -KILL "$(cat "$pid_file")" 2>/dev/null || true
  done
}
trap 'kill_ranks; wait; exit 137' INT TERM
trap 'rm -rf "$run"' EXIT

for ((rank = 0; rank < world; rank++)); do
  mkdir -p "$checkpoints/rank$rank"
  (
    export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=$world RANK=$rank \
      LOCAL_RANK=$rank LOCAL_WORLD_SIZE=$world NODE_RANK=0 \
      FALLOW_REPLICA=$rank FALLOW_REPLICAS=$world FALLOW_PEERS=$peers \
      FALLOW_GANG_EPOCH=${FALLOW_GANG_EPOCH:-1} FALLOW_CHECKPOINT_DIR=$checkpoints/rank$rank \
      FALLOW_LEASE_ID=local-$rank FALLOW_EPOCH=1 \
      GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo} PYTHONUNBUFFERED=1
    "$PYTHON" "$script" "$@" 2>&1 &
    echo $! >"$run/rank$rank.pid"
    status=0
    wait $! || status=$?
    echo "$status" >"$run/rank$rank.rc"
  ) 2>&1 | sed -u "s/^/[rank$rank] /" &
done
wait

for ((rank = 0; rank < world; rank++)); do
  status=$(cat "$run/rank$rank.rc" 2>/dev/null || echo 255)
  if [ "$status" != 0 ]; then
    echo "run_local: rank $rank exited $status" >&2
    exit "$status"
  fi
done
