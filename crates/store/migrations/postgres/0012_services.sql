-- Services: a tenant's long-running replicas behind the gateway, kept at a number of replicas
-- by the leader. `spec` is the service as last deployed or updated (its `version`);
-- `stable_spec` the last version whose roll-out completed, kept while a new one rolls out so
-- the old replicas can be replaced if the new version fails. `desired` is the replica count the
-- autoscaler or `service scale` chose. A lease's `ready_at` is when its agent found a
-- serving replica's health check answering; the gateway routes only to ready replicas.
CREATE TABLE services (
    id BIGSERIAL PRIMARY KEY,
    tenant_id BIGINT NOT NULL REFERENCES accounts(id),
    name TEXT NOT NULL,
    spec TEXT NOT NULL,
    version BIGINT NOT NULL,
    stable_spec TEXT NOT NULL,
    stable_version BIGINT NOT NULL,
    desired BIGINT NOT NULL,
    status TEXT NOT NULL DEFAULT '',
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    UNIQUE (tenant_id, name)
);
ALTER TABLE leases ADD COLUMN ready_at BIGINT;
