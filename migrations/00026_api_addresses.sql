-- +goose Up
-- The addresses the processes serving the API are reached at, as each advertised it
-- when it started. A worker run apart from the API, with no public URL configured,
-- writes the approval links of paused tasks with the newest one.
CREATE TABLE api_addresses (
    url     text PRIMARY KEY,
    seen_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE api_addresses;
