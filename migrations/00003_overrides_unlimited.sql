-- +goose Up
-- Overrides used to read 0 as "limit off". Now a number is the limit itself (0 allows
-- nothing) and "unlimited" turns a limit off, so stored zeros become "unlimited" and
-- keep their meaning; a burst of 0 meant the default burst and goes.
UPDATE tenants SET overrides = (
    SELECT COALESCE(jsonb_object_agg(key, CASE WHEN value = '0'::jsonb THEN '"unlimited"'::jsonb ELSE value END), '{}'::jsonb)
    FROM jsonb_each(overrides)
    WHERE NOT (key LIKE '%\_burst' AND value = '0'::jsonb)
)
WHERE EXISTS (SELECT 1 FROM jsonb_each(overrides) WHERE value = '0'::jsonb);

-- +goose Down
UPDATE tenants SET overrides = (
    SELECT COALESCE(jsonb_object_agg(key, CASE WHEN value = '"unlimited"'::jsonb THEN '0'::jsonb ELSE value END), '{}'::jsonb)
    FROM jsonb_each(overrides)
)
WHERE EXISTS (SELECT 1 FROM jsonb_each(overrides) WHERE value = '"unlimited"'::jsonb);
