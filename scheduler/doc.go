// Package scheduler moves work from per-tenant Redis queues into a small, fixed set of
// asynq queues (one per priority band), in weighted-fair order and never faster than
// the live worker pool can take it.
//
// Design notes:
//
//   - Each tenant has a ZSET queue scored (9-priority)·1e13 + ms since 2025-01-01, so
//     higher priority comes first, then admission order. The score is derived from the
//     task row alone, so re-pushing a task from Postgres restores its exact place.
//   - Backlogged tenants sit in their shard's "ready" ZSET, scored by pass (stride
//     scheduling). Dispatch takes the smallest pass, pops one task, and advances the
//     pass by cost ÷ weight. A tenant that becomes backlogged again starts at the
//     shard's virtual time, the pass of the last dispatch: idle tenants bank no credit.
//   - A tenant at its running cap is moved from "ready" to "capped" and waits there,
//     outside the shared pool, until a completion brings it back.
//   - Dispatch is one Lua script, so several scheduler processes can run with no
//     leader. The popped task goes to a "dispatching" ZSET before it is handed to asynq
//     with TaskID = task id; a confirmation moves it to "inflight". An entry left in
//     "dispatching" by a crash is re-sent (asynq refuses the duplicate id harmlessly).
//   - Backpressure: dispatching + inflight never exceed the live workers' registered
//     slots plus a small prefetch, so asynq never becomes a long FIFO.
//   - Dispatchers wake on pub/sub messages published by admissions and completions; a
//     timer is only the fallback.
package scheduler
