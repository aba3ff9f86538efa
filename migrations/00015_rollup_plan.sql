-- +goose Up
-- The plan in force in each billing period, for the usage export: the tenant's plan
-- at the period's last recorded step or plan change (a change rewrites the plan of
-- the period it falls in and keeps the earlier periods' as they were). A period with
-- no row takes the plan of the latest row before it. Rows written before plans were
-- recorded take the tenant's plan at the time of this migration: nothing older is
-- known.
ALTER TABLE usage_rollup_period ADD COLUMN plan text;
UPDATE usage_rollup_period r SET plan = t.plan FROM tenants t WHERE t.id = r.tenant_id;
UPDATE usage_rollup_period SET plan = '' WHERE plan IS NULL;
ALTER TABLE usage_rollup_period ALTER COLUMN plan SET NOT NULL;

-- +goose Down
ALTER TABLE usage_rollup_period DROP COLUMN plan;
