-- +goose Up
-- A task's row is written three times (insert, start, end), and neither update is
-- heap-only. Room left on each page lets the start and the end put the row's new
-- version on the page of the old one: Postgres then logs only the bytes that changed
-- (the row is about 400 bytes, the start and end change a few dozen), and a task
-- dirties one heap page instead of up to three. Pages filled from now on keep the room;
-- the table is not rewritten.
ALTER TABLE tasks SET (fillfactor = 70);

-- +goose Down
ALTER TABLE tasks RESET (fillfactor);
