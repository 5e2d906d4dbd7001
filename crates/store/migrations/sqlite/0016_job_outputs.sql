-- Replicas' output archives (a tar of `$FALLOW_OUTPUT_DIR`): one per lease, its newest epoch's.
-- `archive` holds the bytes where the coordinator keeps them (at most 16 MiB); it is NULL where
-- the archive went to the job's `output_url` and only its attested digest and size are known.
CREATE TABLE job_outputs (
    lease_id BIGINT PRIMARY KEY,
    epoch BIGINT NOT NULL,
    job_id BIGINT NOT NULL,
    replica BIGINT NOT NULL,
    digest TEXT NOT NULL,
    size_bytes BIGINT NOT NULL,
    archive BLOB,
    received_at BIGINT NOT NULL
);
CREATE INDEX job_outputs_by_job ON job_outputs (job_id, replica);
