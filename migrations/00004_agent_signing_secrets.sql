-- +goose Up
-- Each HTTP agent's own key for signing its step requests (generated at registration,
-- shown once, rotatable). The worker needs the key itself to compute the HMAC, so it
-- is stored as is, never logged and never returned by a read. NULL marks an agent
-- registered before per-agent secrets: it is signed with the deployment-wide
-- AGENTQ_AGENT_SECRET until its secret is rotated.
ALTER TABLE agents
    ADD COLUMN signing_secret text,
    ADD COLUMN signing_secret_created_at timestamptz,
    ADD CONSTRAINT agents_signing_secret_pair CHECK ((signing_secret IS NULL) = (signing_secret_created_at IS NULL));

-- +goose Down
ALTER TABLE agents
    DROP CONSTRAINT agents_signing_secret_pair,
    DROP COLUMN signing_secret_created_at,
    DROP COLUMN signing_secret;
