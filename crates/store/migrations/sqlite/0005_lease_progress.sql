-- What a replica reports it has done (tokens, samples…), for the job's cost per unit.
CREATE TABLE lease_progress (
    lease_id BIGINT PRIMARY KEY,
    unit TEXT NOT NULL,
    done BIGINT NOT NULL,
    at BIGINT NOT NULL
);
