-- The runtimes a node's agent runs replicas in (comma-separated: container, process).
ALTER TABLE nodes ADD COLUMN runtimes TEXT NOT NULL DEFAULT 'container,process';
