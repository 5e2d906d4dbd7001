-- Hybrid: the provider accounts of a tenant's own organisation that it linked. Its jobs go to
-- those accounts' nodes first, at no market price, and to the market only when they do not fit.
CREATE TABLE own_providers (
    tenant_id BIGINT NOT NULL REFERENCES accounts(id),
    provider_id BIGINT NOT NULL REFERENCES accounts(id),
    linked_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, provider_id)
);
CREATE INDEX own_providers_by_provider ON own_providers (provider_id);
