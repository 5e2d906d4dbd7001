-- A replica's output, as its agent sends it: chunks at byte offsets of the replica's log, so a
-- chunk sent twice is stored once.
CREATE TABLE lease_logs (
    id BIGSERIAL PRIMARY KEY,
    lease_id BIGINT NOT NULL,
    epoch BIGINT NOT NULL,
    byte_offset BIGINT NOT NULL,
    text TEXT NOT NULL,
    at BIGINT NOT NULL,
    UNIQUE (lease_id, epoch, byte_offset)
);
CREATE INDEX lease_logs_lease ON lease_logs(lease_id, id);
