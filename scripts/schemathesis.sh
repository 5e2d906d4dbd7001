#!/usr/bin/env bash
# Schemathesis against a coordinator that has something to find: `fallow server` on a fresh
# SQLite file, three simulated agents (two regions online, the process executor), a tenant with
# credit and jobs in every state (running, finished, failed, cancelled, and queued for a region
# no node is in, a model no node has, a bid under every ask), then `schemathesis run` on
# /v1/openapi.json as the tenant, the provider and the admin (the reads first, then every
# operation), with path ids mostly drawn from the market's own, and every check (`--checks all`:
# no 5xx, status codes, media types and bodies as documented, schema-valid requests accepted and
# invalid ones refused). Fails on any finding.
#
#   scripts/schemathesis.sh                     # builds target/debug/fallow if it is missing
#   FALLOW_BIN=path/to/fallow scripts/schemathesis.sh
#   FALLOW_SCHEMATHESIS_EXAMPLES=200 scripts/schemathesis.sh   # a longer run (default 25)
#   FALLOW_SCHEMATHESIS_CHECKS=not_a_server_error scripts/schemathesis.sh   # fewer checks
#
# Needs python3 with venv; installs schemathesis into a virtual environment under the work
# directory unless `schemathesis` is on PATH (or SCHEMATHESIS names one).
set -euo pipefail
cd "$(dirname "$0")/.."

schemathesis_version=4.32.5
examples=${FALLOW_SCHEMATHESIS_EXAMPLES:-25}
seed=${FALLOW_SCHEMATHESIS_SEED:-17}
checks=${FALLOW_SCHEMATHESIS_CHECKS:-all}
port=${FALLOW_SCHEMATHESIS_PORT:-7391}
base="http://127.0.0.1:$port"
fallow=${FALLOW_BIN:-target/debug/fallow}
if [ ! -x "$fallow" ]; then
  cargo build -q -p fallow
  fallow=target/debug/fallow
fi
fallow=$(realpath "$fallow")

work=$(mktemp -d /tmp/fallow-schemathesis.XXXXXX)
pids=()
stop() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  if [ "${FALLOW_SCHEMATHESIS_KEEP:-0}" = 1 ]; then
    echo "schemathesis: kept $work"
  else
    rm -rf "$work"
  fi
}
trap stop EXIT

st=${SCHEMATHESIS:-$(command -v schemathesis || true)}
if [ -z "$st" ]; then
  python3 -m venv "$work/venv"
  # anyio 4.15 imports lazily through compile(), which trips CPython 3.11's "AST constructor
  # recursion depth mismatch" inside schemathesis' generator; 4.14 imports plainly.
  "$work/venv/bin/pip" install -q "schemathesis==$schemathesis_version" "anyio<4.15"
  # The same CPython 3.11 fault inside hypothesis, when it describes a filter (see the file).
  site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cp scripts/fallow_ast_guard.py "$site/"
  echo "import fallow_ast_guard" >"$site/fallow_ast_guard.pth"
  st="$work/venv/bin/schemathesis"
fi
"$st" --version

# Nodes heartbeat every second and are never timed out during the run; canaries are rare.
"$fallow" server --listen "127.0.0.1:$port" --data-dir "$work/server" --gold-without-badge \
  --heartbeat-interval-ms 1000 --heartbeat-timeout-ms 3600000 --canary-within-ms 2592000000 \
  >"$work/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  curl -fsS "$base/v1/health" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "$base/v1/health" >/dev/null || { cat "$work/server.log" >&2; exit 1; }

# Accounts, keys and credit through the API; the keys are written to $work.
python3 - "$base" "$work" <<'EOF'
import json, sys, urllib.request
base, work = sys.argv[1], sys.argv[2]
admin = open(f"{work}/server/admin.key").read().strip()

def call(method, path, key, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("authorization", f"Bearer {key}")
    if data is not None:
        request.add_header("content-type", "application/json")
    with urllib.request.urlopen(request) as reply:
        return json.loads(reply.read() or "null")

keys = {"admin": admin}
for role, name in [("tenant", "acme"), ("tenant", "bystander"), ("provider", "gpu-farm")]:
    made = call("POST", "/v1/admin/accounts", admin, {"role": role, "name": name})
    keys[name] = made["api_key"]["api_key"]
    if role == "tenant":
        call("POST", "/v1/admin/credits", admin,
             {"account_id": made["account"]["id"], "amount": "500.00", "key": f"credit-{name}"})
for name, key in keys.items():
    open(f"{work}/{name}.key", "w").write(key + "\n")
EOF

# Three simulated nodes: two online (us-east, ap-southeast), one stopped after registering.
agent() {
  local name=$1 region=$2 site=$3 gpus=$4
  "$fallow" agent --coordinator "$base" --provider-key "$(cat "$work/gpu-farm.key")" \
    --data-dir "$work/agent-$name" --name "$name" --region "$region" --site "$site" \
    --simulate-gpus "$gpus" --executor process >"$work/agent-$name.log" 2>&1 &
  pids+=($!)
}
agent nyc us-east nyc1 H100-SXM5:4
agent sin ap-southeast sin1 A100-SXM4-80GB:2
agent sfo us-west sfo1 L4:2
sfo_pid=$!
for _ in $(seq 150); do
  [ -s "$work/agent-sfo/node.json" ] && break
  sleep 0.2
done
kill "$sfo_pid" 2>/dev/null || true

# Jobs in every state; prints the ids for schemathesis's dictionary.
job_ids=$(python3 - "$base" "$work" <<'EOF'
import json, sys, time, urllib.error, urllib.request
base, work = sys.argv[1], sys.argv[2]
key = {name: open(f"{work}/{name}.key").read().strip() for name in ["acme", "bystander", "admin"]}

def call(method, path, caller, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("authorization", f"Bearer {key[caller]}")
    if data is not None:
        request.add_header("content-type", "application/json")
    with urllib.request.urlopen(request) as reply:
        return json.loads(reply.read() or "null")

def job(name, caller="acme", **fields):
    request = {"name": name, "image": "/bin/sleep", "command": ["600"], "gpus": 1,
               "tier": "silver", "max_price_per_gpu_hour": "5.00", "max_runtime_s": 3600,
               "runtime": "process", **fields}
    return call("POST", "/v1/jobs", caller, request)["id"]

def state(job_id, caller="acme"):
    # The list, not GET /v1/jobs/{id}: that one explains a queued job.
    for listed in call("GET", "/v1/jobs?limit=500", caller)["jobs"]:
        if listed["id"] == job_id:
            return listed["state"]

def wait(job_id, states, caller="acme"):
    for _ in range(300):
        now = state(job_id, caller)
        if now in states:
            return now
        time.sleep(0.2)
    sys.exit(f"job {job_id} never reached {states}; last {now}")

ids = [
    job("nowhere", regions=["eu-west"]),
    job("eu-or-us-west", regions=["eu-west", "us-west"]),
    job("no-b200", gpu_models=["B200"]),
    job("too-cheap", max_price_per_gpu_hour="0.01"),
    job("theirs-nowhere", caller="bystander", regions=["eu-west"]),
]
running = job("running", regions=["us-east"])
wait(running, ["running"])
theirs = job("theirs-running", caller="bystander", regions=["ap-southeast"], gpu_models=["A100"])
wait(theirs, ["running"], caller="bystander")
finished = job("finished", image="/bin/true", command=[], regions=["us-east"])
failed = job("failed", image="/bin/false", command=[], regions=["us-east"])
wait(finished, ["finished"])
wait(failed, ["failed", "finished"])
cancelled = job("cancelled", gpu_models=["B200"])
call("POST", f"/v1/jobs/{cancelled}/cancel", "acme", {})
ids += [running, theirs, finished, failed, cancelled]
# A booking two days ahead, so that reservation ids exist (and cancellations find one).
booked = call("POST", "/v1/reservations", "acme", {
    "gpus": 2, "gpu_model": "H100", "starts_at_us": int((time.time() + 2 * 86400) * 1e6), "hours": 2,
    "max_price_per_gpu_hour": "5.00"})
ids.append(booked["id"])
nodes = [node["id"] for node in call("GET", "/v1/nodes", "admin")]
print(",".join(str(i) for i in ids + nodes))
EOF
)
echo "schemathesis: market ready: jobs and nodes $job_ids"

# Path ids mostly from the market (jobs, nodes and leases share small integers); in job bodies
# (submissions and quotes) mostly the fleet's regions or eu-west, where no node is, and tiers,
# prices, models and topologies that parse, so that more of them reach the matcher.
cat >"$work/schemathesis.toml" <<EOF
[dictionaries.market_ids]
values = [$job_ids, 1, 2, 3]

[dictionaries.regions]
values = ["eu-west", "us-east", "ap-southeast", "us-west"]

[dictionaries.tiers]
values = ["gold", "silver", "bronze"]

[dictionaries.prices]
values = ["2.50", "5.00", "0.01"]

[dictionaries.models]
values = ["H100-SXM5", "A100", "L4", "B200"]

[dictionaries.topologies]
values = ["any", "node", "site", "region"]

# A body past the size limit is refused with a 413: a refusal like any other.
[checks.negative_data_rejection]
expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429, "5xx"]

# A valid request may find too little money behind it (402: a tenant's balance, a provider's
# earnings for its own bond): that is the market's state, not the document's.
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", 401, 402, 403, 404, 409, 429, "5xx"]

# Rules JSON Schema cannot state, so that a body the document admits may still be refused with
# a 400 that names the rule: the offer filter is a language; a node key must not be a weak
# (small-order) point; a window's or a price rule's start comes before its end, and a port
# range's first port before its last; a service's min_replicas is at most its max_replicas; a
# reclaim takes at most the node's GPUs; a booking starts in the future, within a year. Every
# other check applies to these as to the rest.
[[operations]]
include-operation-id = ["searchOffers", "registerNode", "registerNodes", "setNodePolicy", "agentRestateNode", "deployService", "updateService", "scaleService", "reclaimNode", "agentReclaim", "createReservation"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", 400, 401, 402, 403, 404, 409, 429, "5xx"]

[parameters]
"path.id" = { dictionary = "market_ids", probability = 0.6 }
"body.regions[*]" = { dictionary = "regions", probability = 0.6 }
"body.tier" = { dictionary = "tiers", probability = 0.7 }
"body.max_price_per_gpu_hour" = { dictionary = "prices", probability = 0.7 }
"body.gpu_models[*]" = { dictionary = "models", probability = 0.7 }
"body.topology" = { dictionary = "topologies", probability = 0.7 }
EOF

status=0
run() {
  local who=$1
  shift
  echo "schemathesis: as $who: $*"
  "$st" --config-file "$work/schemathesis.toml" run "$base/v1/openapi.json" \
    --checks "$checks" \
    --header "Authorization: Bearer $(cat "$work/$who.key")" \
    --max-examples "$examples" --seed "$seed" --workers 2 \
    --phases examples,coverage,fuzzing \
    --request-timeout 40 --no-color --warnings off "$@" ||
    status=$?
}
# The reads (and the quote) first, while every job is still in the state it was made in; then
# every operation, cancellations included, but for rotating the caller's own key, which would
# sign the rest of the run out.
for who in acme gpu-farm admin; do
  run "$who" --include-method GET --include-path /v1/jobs/quote
done
for who in acme gpu-farm admin; do
  run "$who" --exclude-path /v1/keys/rotate
done
curl -fsS "$base/v1/health" >/dev/null || { echo "schemathesis: the server stopped answering" >&2; status=1; }
if [ "$status" != 0 ]; then
  echo "schemathesis: findings above; server log tail:" >&2
  tail -n 40 "$work/server.log" >&2
fi
exit "$status"
