// Package runtime executes agent tasks on the shared worker pool: asynq hands a task to
// a Worker, which runs the agent's steps through an Executor (the built-in sim agent,
// Go handlers registered in process, and HTTP agents) under the task's budget, records
// usage after every step, and performs the terminal transition in Postgres.
//
// The terminal transition is a conditional UPDATE (state must still be running), so
// exactly one party ends a task — the worker, a tenant's cancel, or the janitor
// abandoning a task whose workers keep dying — and that party owns the side effects
// of the end.
package runtime
