-- +goose Up
-- Task trees: a task a step spawned knows its parent, its tree's root and its depth;
-- (parent_id, spawn_step, spawn_index) makes a step's spawns exactly once however
-- often the step is retried. A root keeps root_id NULL (its own id stands for it)
-- and depth 0, so a task outside any tree has no entry in the tree indexes: both are
-- partial, and a plain task's start and end write nothing to them.
-- children counts the tasks a task spawned (a task with none has no descendants to
-- cancel when it ends); spawned is what its latest spawning step asked for and got,
-- carried to its next step.
ALTER TABLE tasks
    ADD COLUMN parent_id   uuid,
    ADD COLUMN root_id     uuid,
    ADD COLUMN depth       smallint NOT NULL DEFAULT 0,
    ADD COLUMN children    integer NOT NULL DEFAULT 0,
    ADD COLUMN spawn_step  integer,
    ADD COLUMN spawn_index smallint,
    ADD COLUMN spawned     jsonb;
CREATE UNIQUE INDEX tasks_spawn_idx ON tasks (parent_id, spawn_step, spawn_index) WHERE parent_id IS NOT NULL;
CREATE INDEX tasks_root_idx ON tasks (root_id, id) WHERE root_id IS NOT NULL;
-- The live trees the operator view lists: only a spawned task still live has an entry.
CREATE INDEX tasks_live_tree_idx ON tasks (root_id) WHERE root_id IS NOT NULL AND state IN ('queued', 'running', 'paused');

-- +goose Down
DROP INDEX IF EXISTS tasks_live_tree_idx;
DROP INDEX IF EXISTS tasks_root_idx;
DROP INDEX IF EXISTS tasks_spawn_idx;
ALTER TABLE tasks DROP COLUMN spawned, DROP COLUMN spawn_index, DROP COLUMN spawn_step, DROP COLUMN children,
    DROP COLUMN depth, DROP COLUMN root_id, DROP COLUMN parent_id;
