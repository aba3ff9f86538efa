// Package scheduler moves work from per-tenant Redis queues into one asynq queue, in
// weighted-fair order measured in worker time, and never faster than the live
// workers' slots can take it.
//
// Design notes:
//
//   - Each tenant has a ZSET queue scored (9-priority)·1e13 + ms since 2025-01-01, so
//     higher priority comes first, then admission order. The score is derived from the
//     task row alone, so re-pushing a task from Postgres restores its exact place.
//   - Backlogged tenants sit in their shard's "ready" ZSET, scored by pass (stride
//     scheduling). Dispatch takes the smallest pass, pops one task, and advances the
//     pass by the tenant's estimated task cost (worker-ms, an EWMA) ÷ weight. At
//     completion the pass is corrected by (worker time taken − estimate) ÷ weight, so
//     shares are fair in worker time, not task count.
//   - A tenant that becomes backlogged again starts at the later of its shard's
//     virtual time (the largest pass dispatched, raised on every shard to the
//     dispatchers' global virtual time) and the finish pass of its last dispatch,
//     kept in its conf when its queue emptied and corrected at completion like any
//     pass. Idle tenants bank no credit, on any shard, and a tenant whose queue
//     empties at every dispatch is charged like a backlogged one. An idle tenant's
//     conf (estimate, finish pass) stays with a TTL.
//   - With several shards the dispatcher serves the shard whose head has the smallest
//     pass, so fairness across shards holds to the same bound as within one.
//   - A tenant at its running cap is moved from "ready" to "capped" and waits there,
//     outside the shared slots, until a completion (or a raised cap) brings it back.
//   - Backpressure: before popping a task the dispatcher takes one of the live
//     workers' slots (one counter under the {g} tag: registered workers' slots plus a
//     small prefetch); the completion gives it back exactly once. So asynq holds at
//     most the slots plus the prefetch, and never becomes a long FIFO.
//   - The pop is one Lua script per shard, so several scheduler processes can run with
//     no leader. Like every script it gets the keys it touches in KEYS: the caller
//     names candidate tenants (the shard's heads as the previous pop answered them),
//     and the script answers "retry" with fresh ones when the head is not among them. The popped task goes to a "dispatching" ZSET before it is handed to
//     asynq with TaskID = task id (see parking below); a confirmation moves it to "inflight". An entry left
//     in "dispatching" by a crash is re-sent (asynq refuses the duplicate id).
//   - Dispatchers wake on pub/sub messages published after admissions and completions,
//     at most one per millisecond per process (a round takes every task that can go);
//     a timer is only the fallback.
//   - A task whose next step waits for token capacity is parked (park.go): its slots
//     go back as at a completion and it waits in its shard's parked set, scored by
//     when its capacity is expected; a dispatch round puts the due ones back on their
//     queues with their old score. Each dispatch after a park has an asynq id of its
//     own (task id and park count), since asynq keeps an id until the delivery that
//     parked the task has returned. A dispatcher notes when the next parked task is
//     due and only ever lowers that time: a park noted while it reads the parked
//     sets is kept when the read answers.
package scheduler
