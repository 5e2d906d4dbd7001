-- A lease preempted for another job's placement (or a gang's repair) names that job while its
-- grace period runs: the matcher released the victim's GPUs when it decided, so a view rebuilt
-- from the store leaves such a lease out, and the two jobs' pages say who waits for whom.
ALTER TABLE leases ADD COLUMN preempted_by BIGINT;
CREATE INDEX leases_preempted_by ON leases(preempted_by) WHERE preempted_by IS NOT NULL;
