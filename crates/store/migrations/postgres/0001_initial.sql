-- Fallow's coordinator state (PostgreSQL). Times are microseconds since the Unix epoch, money is
-- micro-dollars, booleans are 0/1 and JSON is TEXT, so one code path reads both backends.
CREATE TABLE accounts (
    id BIGSERIAL PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('tenant', 'provider', 'admin')),
    name TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL
);
CREATE TABLE api_keys (
    key_id TEXT PRIMARY KEY,
    account_id BIGINT NOT NULL REFERENCES accounts(id),
    secret_hash TEXT NOT NULL,
    label TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT
);
CREATE INDEX api_keys_account ON api_keys(account_id);
CREATE TABLE nodes (
    id BIGSERIAL PRIMARY KEY,
    provider_id BIGINT NOT NULL REFERENCES accounts(id),
    name TEXT NOT NULL,
    public_key TEXT NOT NULL UNIQUE,
    fingerprint TEXT NOT NULL,
    fingerprint_changed_at BIGINT,
    region TEXT NOT NULL,
    site TEXT NOT NULL,
    fabric TEXT NOT NULL,
    nvlink_domain TEXT NOT NULL,
    latitude DOUBLE PRECISION NOT NULL,
    longitude DOUBLE PRECISION NOT NULL,
    gpu_model TEXT NOT NULL,
    gpu_count BIGINT NOT NULL,
    cpu_milli BIGINT NOT NULL,
    memory_mib BIGINT NOT NULL,
    network_mbit_s BIGINT NOT NULL,
    simulated BIGINT NOT NULL,
    policy TEXT NOT NULL,
    datasets TEXT NOT NULL,
    registered_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    last_heartbeat_at BIGINT,
    online BIGINT NOT NULL DEFAULT 0,
    online_changed_at BIGINT NOT NULL DEFAULT 0,
    telemetry TEXT,
    UNIQUE (provider_id, name)
);
CREATE INDEX nodes_online_changed ON nodes(online_changed_at);
CREATE TABLE jobs (
    id BIGSERIAL PRIMARY KEY,
    tenant_id BIGINT NOT NULL REFERENCES accounts(id),
    client_token TEXT,
    spec TEXT NOT NULL,
    tier TEXT NOT NULL,
    state TEXT NOT NULL,
    state_reason TEXT NOT NULL DEFAULT '',
    submitted_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    UNIQUE (tenant_id, client_token)
);
CREATE INDEX jobs_state ON jobs(state, id);
CREATE INDEX jobs_tenant ON jobs(tenant_id, id);
CREATE TABLE leases (
    id BIGSERIAL PRIMARY KEY,
    job_id BIGINT NOT NULL REFERENCES jobs(id),
    replica BIGINT NOT NULL,
    node_id BIGINT NOT NULL REFERENCES nodes(id),
    gpu_mask BIGINT NOT NULL,
    gpu_milli BIGINT NOT NULL,
    cpu_milli BIGINT NOT NULL,
    memory_mib BIGINT NOT NULL,
    epoch BIGINT NOT NULL,
    price_micros BIGINT NOT NULL,
    state TEXT NOT NULL,
    tier TEXT NOT NULL,
    gpu_model TEXT NOT NULL,
    region TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expected_end BIGINT NOT NULL,
    preempt_at BIGINT,
    ended_at BIGINT,
    end_reason TEXT NOT NULL DEFAULT ''
);
CREATE INDEX leases_node ON leases(node_id, state);
CREATE INDEX leases_job ON leases(job_id);
CREATE INDEX leases_state ON leases(state);
CREATE INDEX leases_created ON leases(created_at);
CREATE INDEX leases_ended ON leases(ended_at);
CREATE TABLE lease_events (
    id BIGSERIAL PRIMARY KEY,
    lease_id BIGINT NOT NULL,
    epoch BIGINT NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    at BIGINT NOT NULL
);
CREATE INDEX lease_events_lease ON lease_events(lease_id, id);
CREATE TABLE usage_records (
    lease_id BIGINT NOT NULL,
    sequence BIGINT NOT NULL,
    node_id BIGINT NOT NULL,
    gpu_seconds_milli BIGINT NOT NULL,
    charged_micros BIGINT NOT NULL,
    body TEXT NOT NULL,
    signature TEXT NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (lease_id, sequence)
);
CREATE TABLE attestations (
    lease_id BIGINT PRIMARY KEY,
    epoch BIGINT NOT NULL,
    node_id BIGINT NOT NULL,
    body TEXT NOT NULL,
    signature TEXT NOT NULL,
    received_at BIGINT NOT NULL
);
CREATE TABLE ledger_transactions (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    memo TEXT NOT NULL,
    entries TEXT NOT NULL,
    at BIGINT NOT NULL
);
CREATE TABLE ledger_entries (
    id BIGSERIAL PRIMARY KEY,
    tx_key TEXT NOT NULL REFERENCES ledger_transactions(key),
    account TEXT NOT NULL,
    amount BIGINT NOT NULL,
    at BIGINT NOT NULL
);
CREATE INDEX ledger_entries_account ON ledger_entries(account, id);
CREATE TABLE ledger_balances (
    account TEXT PRIMARY KEY,
    balance BIGINT NOT NULL
);
CREATE TABLE nonces (
    node_id BIGINT NOT NULL,
    nonce TEXT NOT NULL,
    seen_at BIGINT NOT NULL,
    PRIMARY KEY (node_id, nonce)
);
CREATE INDEX nonces_seen ON nonces(seen_at);
CREATE TABLE evidence (
    id BIGSERIAL PRIMARY KEY,
    node_id BIGINT,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    at BIGINT NOT NULL
);
CREATE INDEX evidence_node ON evidence(node_id, id);
CREATE TABLE reputation_events (
    id BIGSERIAL PRIMARY KEY,
    node_id BIGINT NOT NULL,
    outcome TEXT NOT NULL,
    at BIGINT NOT NULL
);
CREATE INDEX reputation_events_node ON reputation_events(node_id, id);
-- The reconcile leader's fencing token: a new leader increments it, and every placement
-- checks it in its own transaction, so a deposed leader's late commit fails instead of
-- granting leases the new leader does not know about.
CREATE TABLE leadership (
    id BIGINT PRIMARY KEY,
    epoch BIGINT NOT NULL
);
INSERT INTO leadership (id, epoch) VALUES (1, 0);
