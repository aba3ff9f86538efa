-- +goose Up
-- Named admin credentials with their roles, created through the admin API or the
-- CLI (those in the environment are not stored). Only the token's SHA-256 is kept, as
-- for API keys; a token is found by its hash. A name is never reused, revoked or not,
-- so what a name did stays unambiguous.
CREATE TABLE admin_credentials (
    name        text PRIMARY KEY,
    role        text NOT NULL CHECK (role IN ('admin', 'operator', 'finance', 'viewer')),
    token_hash  bytea NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    rotated_at  timestamptz,
    revoked_at  timestamptz
);

-- +goose Down
DROP TABLE admin_credentials;
