-- Per-service keys: a key that calls one service of its tenant through the gateway and nothing
-- else (not the API). Shown once; only its secret's hash is kept, as for API keys.
CREATE TABLE service_keys (
    key_id TEXT PRIMARY KEY,
    tenant_id BIGINT NOT NULL REFERENCES accounts(id),
    service TEXT NOT NULL,
    secret_hash TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT
);
CREATE INDEX service_keys_service ON service_keys(tenant_id, service);
