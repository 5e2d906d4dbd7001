-- Sites and repairs: the coordinates admins set for a site once (a node that names the site
-- and declares none takes them), where a node's coordinates came from ("flag": declared at
-- registration, "site": the sites table, empty: none), and when a gang's current start barrier
-- was met (a repair's pause in billing ends there, for jobs that ask for it).
CREATE TABLE sites (
    name TEXT PRIMARY KEY,
    latitude DOUBLE PRECISION NOT NULL,
    longitude DOUBLE PRECISION NOT NULL,
    updated_at BIGINT NOT NULL
);
ALTER TABLE nodes ADD COLUMN location_source TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN gang_assembled_at BIGINT;
