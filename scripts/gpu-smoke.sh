#!/usr/bin/env bash
# GPU smoke test: on a machine with an NVIDIA GPU and python3 with PyTorch, starts a coordinator
# and an agent (process executor), checks that the agent reports the GPUs nvidia-smi sees (model,
# count, not simulated) and found them through NVML (not its nvidia-smi fallback), and runs a real
# GPU job through the market: a bf16 matrix product on one GPU. Runs the matmul canary on GPU 0
# (`fallow canary run --kind matmul --self-check`) and prints its TFLOPS next to the catalog's.
# Zeroes GPU 0's free memory (`fallow agent clear-gpu`) and checks a marker written before is gone.
# Prints what it found, and the NVLink domain the agent detects (`fallow agent detect-topology`);
# exits non-zero on any mismatch or a failed check of the canary's product.
#
# Usage: scripts/gpu-smoke.sh            (builds the release binary first)
#        FALLOW_BIN=path/to/fallow scripts/gpu-smoke.sh
# FALLOW_SMOKE_SIMULATE=1 runs the same plumbing with simulated GPUs and a job that only prints,
# to check the script itself on a machine without a GPU; that run proves nothing about GPUs.
set -euo pipefail
cd "$(dirname "$0")/.."

simulate=${FALLOW_SMOKE_SIMULATE:-0}
fail() { echo "gpu-smoke: FAIL: $*" >&2; exit 1; }
say() { echo "gpu-smoke: $*"; }

if [ -z "${FALLOW_BIN:-}" ]; then
  cargo build --release -p fallow >&2
  FALLOW_BIN=target/release/fallow
fi
command -v python3 >/dev/null || fail "python3 is needed"
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1], {'d': d}))" "$1"; }

if [ "$simulate" != 1 ]; then
  command -v nvidia-smi >/dev/null || fail "nvidia-smi is not on PATH: this needs an NVIDIA GPU"
  smi_names=$(nvidia-smi --query-gpu=name --format=csv,noheader)
  smi_count=$(printf '%s\n' "$smi_names" | grep -c .)
  say "nvidia-smi sees $smi_count GPU(s): $(printf '%s' "$smi_names" | sort -u | tr '\n' ';')"
  python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null \
    || fail "python3 cannot use CUDA through PyTorch"
fi

# What the agent reads of how the GPUs are joined (NVLink, an NVL72 fabric) and the NVLink domain
# it would register; informational, never a failure.
say "NVLink topology as the agent reads it:"
{ "$FALLOW_BIN" agent detect-topology 2>&1 || true; } | sed 's/^/    /'

work=$(mktemp -d)
port=${FALLOW_SMOKE_PORT:-7499}
url=http://127.0.0.1:$port
pids=()
cleanup() { for pid in "${pids[@]}"; do kill -INT "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

"$FALLOW_BIN" server --data-dir "$work/coordinator" --listen "127.0.0.1:$port" --heartbeat-interval-ms 1000 \
  >"$work/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -f "$work/coordinator/admin.key" ] && curl -fs "$url/v1/health" >/dev/null && break; sleep 0.1; done
admin=$(cat "$work/coordinator/admin.key")
auth() { printf 'authorization: Bearer %s' "$1"; }
post() { curl -fsS -H 'content-type: application/json' -H "$(auth "$1")" -d "$3" "$url$2"; }
get() { curl -fsS -H "$(auth "$1")" "$url$2"; }

tenant=$(post "$admin" /v1/admin/accounts '{"role":"tenant","name":"smoke-tenant"}')
provider=$(post "$admin" /v1/admin/accounts '{"role":"provider","name":"smoke-provider"}')
tenant_key=$(printf '%s' "$tenant" | json "d['api_key']['api_key']")
tenant_id=$(printf '%s' "$tenant" | json "d['account']['id']")
provider_key=$(printf '%s' "$provider" | json "d['api_key']['api_key']")
post "$admin" /v1/admin/credits "{\"account_id\": $tenant_id, \"amount\": \"100.00\", \"key\": \"smoke\"}" >/dev/null

agent_args=(agent --coordinator "$url" --provider-key "$provider_key" --data-dir "$work/agent" --executor process
  --usage-every-s 2 --grace-s 5 --asks gold=9.00,silver=8.00,bronze=7.00)
[ "$simulate" = 1 ] && agent_args+=(--simulate-gpus H100-SXM5:1)
"$FALLOW_BIN" "${agent_args[@]}" >"$work/agent.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -f "$work/agent/node.json" ] && break; sleep 0.1; done
[ -f "$work/agent/node.json" ] || { cat "$work/agent.log" >&2; fail "the agent did not register"; }
node_id=$(json "d['node_id']" <"$work/agent/node.json")
node=$(get "$provider_key" "/v1/nodes/$node_id")
model=$(printf '%s' "$node" | json "d['gpu_model']")
count=$(printf '%s' "$node" | json "d['gpu_count']")
simulated=$(printf '%s' "$node" | json "d['simulated']")
# The agent logs (JSON lines) which source found the GPUs; simulated GPUs are not detected.
detected_by=$(python3 -c '
import json, sys
for line in sys.stdin:
    try:
        fields = json.loads(line).get("fields", {})
    except (ValueError, AttributeError):
        continue
    if "detected_by" in fields:
        print(fields["detected_by"])
        break
' <"$work/agent.log")
[ "$simulate" = 1 ] && detected_by=${detected_by:-simulated}
say "the agent registered node $node_id: $count x $model, simulated=$simulated, detected by ${detected_by:-?}"
if [ "$simulate" != 1 ]; then
  [ "$simulated" = False ] || fail "the node is marked simulated on a machine with GPUs"
  [ "$count" = "$smi_count" ] || fail "the agent reports $count GPUs, nvidia-smi $smi_count"
  [ "$detected_by" = nvml ] || fail "the agent found the GPUs by ${detected_by:-no logged source}, not NVML" \
    "(is libnvidia-ml.so.1 on the loader's path?)"
fi

# The matmul canary on the device (docs/trust-policy.md § 3): a seeded bf16 product on GPU 0
# through cuBLAS, checked here as the coordinator checks it (--self-check: Merkle paths and
# Freivalds' check against a random vector), its TFLOPS next to the catalog figure of the model
# the agent detected. Simulated: the CPU reference on a small product (plumbing only).
if [ "$simulate" = 1 ]; then
  canary_args=(--device cpu-reference --n 256)
else
  canary_args=(--device cuda --n 4096)
fi
canary=$("$FALLOW_BIN" canary run --kind matmul --seed "smoke-$$" --gpus 0 --self-check "${canary_args[@]}" 2>"$work/canary.err") \
  || { cat "$work/canary.err" >&2; fail "the matmul canary failed or its product's check failed"; }
canary_tflops=$(printf '%s' "$canary" | json "'%.1f' % (d['rate_milli'] / 1000)")
canary_on=$(printf '%s' "$canary" | json "d['measured_on']")
catalog_tflops=$("$FALLOW_BIN" catalog --json | json "[m['dense_tflops'] for m in d if m['name'] == '$model'][0]")
say "matmul canary on $canary_on: $canary_tflops TFLOPS measured; the catalog's $model: $catalog_tflops dense BF16 TFLOPS"
say "    ($(cat "$work/canary.err"))"
if [ "$simulate" != 1 ]; then
  printf '%s' "$canary_on" | grep -q '^cuda:' || fail "the matmul canary did not run on CUDA: $canary_on"
  slow_line=$(python3 -c "print('%.1f' % ($catalog_tflops * 0.45))")
  python3 -c "import sys; sys.exit(0 if $canary_tflops >= $slow_line else 1)" \
    || say "WARNING: under the policy's slow line ($slow_line TFLOPS, 45 % of the catalog's)"
fi

# Clearing a GPU a replica leaves (docs/decisions.md, "No trace left behind"): a process fills
# most of GPU 0's free memory with a marker and exits; `fallow agent clear-gpu` zeroes the free
# memory; a new process then takes as much memory as it can and looks for the marker. Not
# simulated: there is no memory to clear.
if [ "$simulate" != 1 ]; then
  python3 -c "
import torch
free, _ = torch.cuda.mem_get_info(0)
t = torch.full((int(free * 0.9),), 0xA5, dtype=torch.uint8, device='cuda:0')
torch.cuda.synchronize()
print('gpu-smoke: wrote', t.numel() >> 20, 'MiB of 0xA5 on GPU 0')
" || fail "could not write the marker on GPU 0"
  cleared=$("$FALLOW_BIN" agent clear-gpu --gpu 0 2>"$work/clear.err") || { cat "$work/clear.err" >&2; fail "clear-gpu failed"; }
  say "clear-gpu: $cleared"
  python3 -c "
import torch
free, _ = torch.cuda.mem_get_info(0)
t = torch.empty((int(free * 0.9),), dtype=torch.uint8, device='cuda:0')
left = int((t == 0xA5).sum())
print('gpu-smoke: bytes still 0xA5 in', t.numel() >> 20, 'MiB read back:', left)
raise SystemExit(1 if left > t.numel() // 100 else 0)
" || fail "the marker is still in GPU 0's memory after clearing"
fi

if [ "$simulate" = 1 ]; then
  job_program=/bin/sh
  job_args='["-c", "echo bf16 matmul ok simulated"]'
else
  job_program=$(command -v python3)
  job_args='["-c", "import torch; n = 8192; a = torch.randn(n, n, dtype=torch.bfloat16, device=\"cuda\"); torch.cuda.synchronize(); import time; t = time.time(); b = a @ a; torch.cuda.synchronize(); s = time.time() - t; print(\"bf16 matmul ok\", torch.cuda.get_device_name(0), \"%.1f TFLOPS\" % (2 * n ** 3 / s / 1e12), \"mean\", float(b.float().abs().mean()))"]'
fi
job=$(post "$tenant_key" /v1/jobs "{\"name\": \"gpu-smoke\", \"image\": \"$job_program\", \"command\": $job_args,
  \"env\": {\"LD_LIBRARY_PATH\": \"${LD_LIBRARY_PATH:-}\"}, \"gpus\": 1, \"tier\": \"silver\",
  \"max_price_per_gpu_hour\": \"10.00\", \"max_runtime_s\": 600}")
job_id=$(printf '%s' "$job" | json "d['id']")
say "submitted job $job_id"
state=queued
for _ in $(seq 600); do
  state=$(get "$tenant_key" "/v1/jobs/$job_id" | json "d['state']")
  case $state in finished|failed|cancelled) break ;; esac
  sleep 0.5
done
logs=$(get "$tenant_key" "/v1/jobs/$job_id/logs" | json "''.join(c['text'] for c in d['chunks'])")
say "job $job_id ended $state; its output:"
printf '%s\n' "$logs" | sed 's/^/    /'
[ "$state" = finished ] || { tail -20 "$work/agent.log" >&2; fail "the job did not finish"; }
printf '%s' "$logs" | grep -q "bf16 matmul ok" || fail "the job's output lacks the result"
say "PASS"
