-- An owner's reclaim of a node's GPUs (`fallow node reclaim`, `fallow agent pause`): the GPUs
-- of the mask take no new work until `reclaim_until` (NULL: until the owner resumes), and the
-- work on them stops as the reclaim said (docs/trust-policy.md § 8).
ALTER TABLE nodes ADD COLUMN reclaim_gpu_mask BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN reclaim_until BIGINT;
CREATE INDEX nodes_reclaim_until ON nodes(reclaim_until) WHERE reclaim_until IS NOT NULL;
