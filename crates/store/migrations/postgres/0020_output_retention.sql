-- Kept output archives are removed after the coordinator's retention (`--output-retention-days`):
-- their digest and size stay, their bytes go, and `expired_at` says when.
ALTER TABLE job_outputs ADD COLUMN expired_at BIGINT;
CREATE INDEX job_outputs_kept_by_age ON job_outputs (received_at) WHERE archive IS NOT NULL;
