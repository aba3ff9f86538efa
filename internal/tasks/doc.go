// Package tasks is the tasks domain service: submitting a task (validation, budget,
// idempotency, admission, storing, queueing), reading, listing, resuming and
// cancelling a tenant's tasks (Service), and the task lifecycle, each state change of
// a task one transaction (Lifecycle: the submission's new task, the worker's start,
// steps and end, the janitor's requeue or abandonment of a task whose worker died,
// the expiries, and the tenant's resume and cancel). The changes every task makes
// (its creation, its start, its last step with its end) share their transaction with
// those of concurrent calls (group commit, internal/groupcommit): each call still
// returns only once its own change committed. The HTTP API and the worker call it; it
// knows nothing of HTTP.
//
// # Subscribers: what commits with a change, and what follows it
//
// Whatever else a state change causes is a Subscriber's (package change), told of
// the change as one value (change.Change: the kind, the task as the change left it,
// the state it left, the limit that stopped or paused it, the step and the rollups it
// left) at two moments:
//
//   - InTx, inside the change's transaction, on it: what must exist exactly when the
//     change committed. The events outbox (billing/outbox.Subscriber) writes there a
//     step's threshold crossings, a budget stop's, a park's and a pause's events: an
//     event exists if and only if its change committed (docs/reliability.md). An
//     error rolls the change back. A subscriber says which kinds it writes for
//     (Writes): the start every task makes is one statement without a transaction
//     unless a subscriber writes for starts.
//   - AfterCommit, once the change committed, in the goroutine of the call that made
//     it and under its context without its cancel, for every change: what follows the
//     change and cannot be part of it. It cannot undo the change; it logs its
//     failures. The outbox judges a start or an expiry against the plan's
//     commitments there (it reads Redis, which no transaction should wait on), and
//     Ends does what follows every end of a task.
//
// A change made alone and one made in a group commit are told the same way: a
// shared write notes each call's changes on the shared transaction (InTx), and each
// call tells AfterCommit of its own once the commit is done.
//
// # A task's end
//
// Ends is the one after-commit effect of a task's end, whoever ended it: its worker
// (Finish, RecordLastStep), a cancel, a start past the start deadline or the
// deadline pass (ExpireOverdue), the pause watcher (ExpirePauses), the janitor's
// abandonment. It releases the session lease, takes a task that ended while queued
// off its queue and its place in a model pool's line, publishes the end's state
// message on the progress stream (internal/wire's encoder, with the reason the task
// ended with, agentqtype's end reasons) and, for a cancel, tells the worker running
// the task to stop. The worker, which sends its slot release and its end's calls in
// one round trip, asks for the calls instead (CarryEnd).
package tasks
