-- The matmul canary (docs/trust-policy.md § 3): a canary's kind; the challenge the coordinator
-- drew once the node's committed result came in (a hex seed: the rows asked for and the secret
-- vector derive from it) and when; why its finding is what it is, in words for the provider.
-- A node's agent says which canary kinds it can run besides hash (comma-separated: matmul).
ALTER TABLE canaries ADD COLUMN kind TEXT NOT NULL DEFAULT 'hash';
ALTER TABLE canaries ADD COLUMN challenge TEXT;
ALTER TABLE canaries ADD COLUMN challenged_at BIGINT;
ALTER TABLE canaries ADD COLUMN reason TEXT;
ALTER TABLE nodes ADD COLUMN canary_kinds TEXT NOT NULL DEFAULT '';
