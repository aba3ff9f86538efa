// Package store is agentq's Postgres data access: tenants, API keys, tasks, the usage
// ledger and HTTP agents. What a call is scoped to is visible in its name and at its
// call site.
//
// # Scoping
//
// Each call is one of three kinds, and its name says which.
//
//   - Tenant-scoped calls read or write the data of one tenant: its record, its keys,
//     its tasks, its ledger. They take the tenant (TenantID in their params; the id
//     itself for a tenant's record) and refuse an empty one with ErrNoTenant before
//     they touch the database. A row of another tenant does not exist for them
//     (agentqtype.ErrNotFound). These are the calls of the tenant-facing services.
//   - Unscoped calls are named Unscoped…. They act across tenants: the worker reaches
//     a task by the id a queue message carries, the maintenance passes sweep every
//     tenant, authentication finds a key by its kid before any tenant is known, and
//     the operator lists every tenant. Only the worker's task lifecycle, the
//     maintenance passes (some through billing's ledger reads), authentication,
//     operator listings and benchmarks call them;
//     a handler serving a tenant never does.
//   - Calls on the deployment's own configuration (HTTP agents, model pools and
//     the agents bound to them) and on the
//     connection (Ping, Pool, InTx) hold no tenant's data and carry no prefix.
//
// # Transactions
//
// A Store runs its calls on its pool, or, inside InTx, on one transaction: a domain
// service makes a state change and what belongs with it (its events outbox row) one
// commit.
//
// # Claims
//
// A worker's writes on a running task carry its Claim (task id and attempt): a
// worker that stalled past its heartbeat, whose task another attempt took over,
// gets ErrLostClaim and writes nothing; one whose task ended meanwhile gets
// ErrTaskEnded.
package store
