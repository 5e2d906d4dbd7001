-- Capacity booked ahead (`fallow reserve create`): whole GPUs on chosen nodes from a start time
-- for some hours, at a price fixed at booking, paid into the reservation's escrow then.
CREATE TABLE reservations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id BIGINT NOT NULL REFERENCES accounts(id),
    state TEXT NOT NULL,
    state_reason TEXT NOT NULL DEFAULT '',
    request TEXT NOT NULL,
    gpus BIGINT NOT NULL,
    gpu_model TEXT NOT NULL,
    starts_at BIGINT NOT NULL,
    ends_at BIGINT NOT NULL,
    hold_micros BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX reservations_by_tenant ON reservations (tenant_id, id);
CREATE INDEX reservations_by_state ON reservations (state, starts_at);
-- The nodes a reservation holds, each for [held_from, held_until): a node lost is marked
-- (lost_at) and its replacement, if any, is a row of its own.
CREATE TABLE reservation_nodes (
    reservation_id BIGINT NOT NULL REFERENCES reservations(id),
    node_id BIGINT NOT NULL,
    gpus BIGINT NOT NULL,
    price_micros BIGINT NOT NULL,
    held_from BIGINT NOT NULL,
    held_until BIGINT NOT NULL,
    lost_at BIGINT,
    PRIMARY KEY (reservation_id, node_id, held_from)
);
CREATE INDEX reservation_nodes_by_node ON reservation_nodes (node_id);
-- The reservation a job runs inside, if any (few jobs do: the index holds only those).
ALTER TABLE jobs ADD COLUMN reservation_id BIGINT;
CREATE INDEX jobs_by_reservation ON jobs (reservation_id) WHERE reservation_id IS NOT NULL;
