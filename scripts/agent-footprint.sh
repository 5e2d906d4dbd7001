#!/usr/bin/env bash
# The agent's footprint: resident memory and CPU time of the `fallow agent` process while idle
# and while it runs a job, with a coordinator on the same machine (simulated GPUs, process
# executor, heartbeats every 10 s), and of a running replica's guard process. Prints one JSON object.
# Linux only (reads /proc).
#
# Usage: scripts/agent-footprint.sh            (builds the release binary first)
#        FALLOW_BIN=path/to/fallow SECONDS_EACH=30 scripts/agent-footprint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${FALLOW_BIN:-}" ]; then
  cargo build --release -p fallow >&2
  FALLOW_BIN=target/release/fallow
fi
each=${SECONDS_EACH:-20}
work=$(mktemp -d)
port=${FALLOW_FOOTPRINT_PORT:-7498}
url=http://127.0.0.1:$port
pids=()
cleanup() { for pid in "${pids[@]}"; do kill -INT "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1], {'d': d}))" "$1"; }

"$FALLOW_BIN" server --data-dir "$work/coordinator" --listen "127.0.0.1:$port" >"$work/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -f "$work/coordinator/admin.key" ] && curl -fs "$url/v1/health" >/dev/null && break; sleep 0.1; done
admin=$(cat "$work/coordinator/admin.key")
post() { curl -fsS -H 'content-type: application/json' -H "authorization: Bearer $1" -d "$3" "$url$2"; }
tenant=$(post "$admin" /v1/admin/accounts '{"role":"tenant","name":"t"}')
provider=$(post "$admin" /v1/admin/accounts '{"role":"provider","name":"p"}')
tenant_key=$(printf '%s' "$tenant" | json "d['api_key']['api_key']")
post "$admin" /v1/admin/credits "{\"account_id\": $(printf '%s' "$tenant" | json "d['account']['id']"), \"amount\": \"100.00\", \"key\": \"f\"}" >/dev/null
"$FALLOW_BIN" agent --coordinator "$url" --provider-key "$(printf '%s' "$provider" | json "d['api_key']['api_key']")" \
  --data-dir "$work/agent" --executor process --simulate-gpus H100-SXM5:8 >"$work/agent.log" 2>&1 &
agent=$!
pids+=($agent)
for _ in $(seq 100); do [ -f "$work/agent/node.json" ] && break; sleep 0.1; done

ticks=$(getconf CLK_TCK)
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$agent/status"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$agent/stat"; }
# Samples resident memory every second for `each` seconds; prints "max_rss_kib cpu_seconds".
sample() {
  local before max=0 rss
  before=$(cpu_ticks)
  for _ in $(seq "$each"); do
    rss=$(rss_kib); [ "$rss" -gt "$max" ] && max=$rss
    sleep 1
  done
  echo "$max $(python3 -c "print(round(($(cpu_ticks) - $before) / $ticks, 3))")"
}
sleep 2
read -r idle_rss idle_cpu < <(sample)
post "$tenant_key" /v1/jobs "{\"name\": \"busy\", \"image\": \"/bin/sh\", \"command\": [\"-c\", \"while true; do echo tick; sleep 0.2; done\"], \"gpus\": 8, \"tier\": \"silver\", \"max_price_per_gpu_hour\": \"5.00\", \"max_runtime_s\": 3600}" >/dev/null
sleep 2
read -r busy_rss busy_cpu < <(sample)
# Each running replica has a guard process beside it (`fallow agent guard`, a child of the agent).
guard=$(pgrep -P "$agent" -f 'agent guard' | head -1 || true)
guard_rss=$([ -n "$guard" ] && awk '/^VmRSS:/ {print $2}' "/proc/$guard/status" || echo 0)
cat <<EOF
{"seconds_each": $each, "idle_rss_mib": $(python3 -c "print(round($idle_rss / 1024, 1))"), "idle_cpu_pct": $(python3 -c "print(round(100 * $idle_cpu / $each, 2))"), "running_rss_mib": $(python3 -c "print(round($busy_rss / 1024, 1))"), "running_cpu_pct": $(python3 -c "print(round(100 * $busy_cpu / $each, 2))"), "guard_rss_mib_per_replica": $(python3 -c "print(round($guard_rss / 1024, 1))")}
EOF
