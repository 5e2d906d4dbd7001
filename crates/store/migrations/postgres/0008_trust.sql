-- The trust policy (docs/trust-policy.md): canaries ordered on nodes and what they found,
-- fraud decided with its evidence and the slash it cost, and the cordon of a node whose fraud
-- is proven (lifted when a canary passes on its current hardware).
CREATE TABLE canaries (
    id BIGSERIAL PRIMARY KEY,
    node_id BIGINT NOT NULL,
    seed TEXT NOT NULL,
    units BIGINT NOT NULL,
    gpus TEXT NOT NULL,
    memory_mib BIGINT NOT NULL,
    claimed_model TEXT NOT NULL,
    expected_rate_milli BIGINT NOT NULL,
    fingerprint TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    deadline_at BIGINT NOT NULL,
    delivered_at BIGINT,
    finished_at BIGINT,
    finding TEXT,
    rate_milli BIGINT,
    result TEXT,
    signature TEXT
);
CREATE INDEX canaries_node ON canaries(node_id, id);
CREATE INDEX canaries_open ON canaries(finished_at) WHERE finished_at IS NULL;
CREATE TABLE frauds (
    id BIGSERIAL PRIMARY KEY,
    node_id BIGINT NOT NULL,
    provider_id BIGINT NOT NULL,
    kind TEXT NOT NULL,
    section TEXT NOT NULL,
    share_permille BIGINT NOT NULL,
    bond_before BIGINT NOT NULL,
    slashed BIGINT NOT NULL,
    refunds TEXT NOT NULL,
    to_platform BIGINT NOT NULL,
    evidence TEXT NOT NULL,
    decided_at BIGINT NOT NULL,
    ledger_key TEXT NOT NULL UNIQUE
);
CREATE INDEX frauds_provider ON frauds(provider_id, id);
CREATE INDEX frauds_node ON frauds(node_id, id);
ALTER TABLE nodes ADD COLUMN fraud_cordoned_at BIGINT;
CREATE INDEX evidence_node_at ON evidence(node_id, at);
CREATE INDEX usage_records_node ON usage_records(node_id, received_at);
-- Outcomes may weigh other than one: an hour of a committed window is recorded as the share
-- of it the node was there or away, in thousandths.
ALTER TABLE reputation_events ADD COLUMN weight_milli BIGINT NOT NULL DEFAULT 1000;
CREATE INDEX reputation_events_at ON reputation_events(at);
