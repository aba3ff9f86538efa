// Package runtime executes agent tasks in the workers' shared slots: asynq hands a task to
// a Worker, which runs the agent's steps through an Executor (the built-in sim agent,
// Go handlers registered in process, and HTTP agents) under the task's budget, records
// usage after every step, and performs the terminal transition in Postgres.
//
// One delivery of a task is a taskRun, whose methods are its phases: claim the task,
// prepare its limits and agent, then per step reserve it against the tenant's quotas,
// call the agent, record the step and settle its reservation, and at the end give the
// dispatch slots back and record the terminal state (in the background while the
// claim is fresh). Each phase returns an outcome: on to the next, or the run stops
// (the task re-queued or not). What the phases share lives on the taskRun, so a step
// allocates little beyond what the calls it makes need; a step's reservation is one
// value of it (reservation), which holds what was taken of the tenant's quotas and of
// the model pool and settles or gives back both together.
//
// Token capacity: each step reserves its estimated tokens from its tenant's
// ai_tokens_per_minute (inside the step's quota reservation) and, when its agent is
// bound to a model pool and that reservation passed, from the pool: a step its own
// limits hold back takes nothing of the pool and no place in its line (a quota stops
// or pauses the task at once; its tokens per minute park it on the longer of its
// own wait and the pool's, read without a place). A step that cannot get them does
// not wait on its worker: the task is parked (queued in Postgres with what it waits
// for, out of its queue in Redis until the capacity is expected) and the delivery
// returns, so the worker and the tenant's running slot go to others. The next
// delivery resumes at the step that waited; the times a step parked before it ran
// are metered (agentq.step_parks). A throttled answer (the agent's upstream refused
// the step) counts nothing and parks the task for its retry time (or its tenant's
// back-off from the pool), a wait charged to its wall clock. Reservations and
// settlements are sent without the delivery's cancellation (an answer Redis gave must
// be read, or what it took would never go back), within a timeout.
//
// The terminal transition is a conditional UPDATE (state must still be running), so
// exactly one party ends a task — the worker, a tenant's cancel, or the janitor
// abandoning a task whose workers keep dying — and that party owns the side effects
// of the end.
package runtime
