-- Datasets nodes are asked to stage ahead (`fallow dataset warm`): delivered with the node's
-- heartbeats until it holds the dataset or the warm-up lapses at `expires_at`.
CREATE TABLE dataset_warmups (
    node_id BIGINT NOT NULL,
    digest TEXT NOT NULL,
    url TEXT NOT NULL,
    size_bytes BIGINT NOT NULL,
    tenant_id BIGINT NOT NULL,
    requested_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (node_id, digest)
);
CREATE INDEX dataset_warmups_by_expiry ON dataset_warmups (expires_at);
