-- The reconcile loop asks for the newest node change every pass: an index answers it without
-- reading the table.
CREATE INDEX nodes_updated ON nodes(updated_at);
