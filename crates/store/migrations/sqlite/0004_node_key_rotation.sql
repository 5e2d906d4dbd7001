-- A node's key can be rotated: replicas forget the cached old key when this moves.
ALTER TABLE nodes ADD COLUMN key_rotated_at BIGINT NOT NULL DEFAULT 0;
CREATE INDEX nodes_key_rotated ON nodes(key_rotated_at);
