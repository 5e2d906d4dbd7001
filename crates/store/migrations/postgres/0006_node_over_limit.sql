-- A node over its owner's thermal or power limit takes no new work; bronze work on it is
-- preempted when the condition persists. `over_limit_changed_at` feeds the leader's matcher.
ALTER TABLE nodes ADD COLUMN over_limit_since BIGINT;
ALTER TABLE nodes ADD COLUMN over_limit_changed_at BIGINT NOT NULL DEFAULT 0;
CREATE INDEX nodes_over_limit_changed ON nodes(over_limit_changed_at);
CREATE INDEX nodes_over_limit_since ON nodes(over_limit_since) WHERE over_limit_since IS NOT NULL;
