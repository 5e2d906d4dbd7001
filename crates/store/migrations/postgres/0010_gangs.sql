-- Gangs that train: where a node's replicas are reached (its advertised address and the ports its
-- agent hands out), where its NVLink domain came from and what NVML reported; a gang replica's
-- reserved port once it is staged (the start barrier waits for every replica's); and a job's
-- gang epoch (grows at each placement and repair), when its barrier started, and the nodes it
-- avoids (a replica could not start there), and how often it restarted after a replica failed.
ALTER TABLE nodes ADD COLUMN advertise_addr TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN gang_ports TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN nvlink_source TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN nvlink_detected TEXT NOT NULL DEFAULT '';
ALTER TABLE leases ADD COLUMN gang_port BIGINT;
ALTER TABLE jobs ADD COLUMN gang_epoch BIGINT NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN gang_since BIGINT;
ALTER TABLE jobs ADD COLUMN avoid_nodes TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN gang_restarts BIGINT NOT NULL DEFAULT 0;
