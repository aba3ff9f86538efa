// Package webhooks manages the webhook endpoints (Webhooks: the operator's and each
// tenant's own) and delivers the events outbox (package billing/outbox) to them
// (Relay, the relay role's background service).
//
// # Webhook delivery
//
// The relay (the relay role) pushes the outbox to the endpoints Webhooks manages, in
// two steps that any number of relays share. Fan-out: the relays have one position in
// the feed order; the relay that locks it (the others skip, they do not wait) reads
// the events after it, writes a pending delivery for each endpoint an event is for
// (enabled, of its type, of its tenant or of all, created before it: the event's xid
// above the endpoint's) and moves the position, in one transaction, so each event is
// fanned out once and, being read behind the feed's horizon, none is passed over.
// Sending: a relay claims due deliveries (FOR UPDATE SKIP LOCKED) and leases each,
// the request timeout plus a minute; no other relay claims it while the lease runs,
// and an outcome is written only while the delivery still carries the claim that
// sent it. A relay that dies mid-send leaves the delivery to the next claim once the
// lease lapses: at least once, with the event id as webhook-id for the receiver to
// deduplicate. Each request is the stored bytes, signed with the Standard Webhooks
// library (with the replaced secret too during a rotation's grace); 2xx delivers,
// 410 disables the endpoint and cancels its pending deliveries, anything else is
// retried on StandardSchedule with jitter and given up after its last attempt. Every
// attempt is recorded. The clock (its Archetype) and the schedule are RelayConfig's,
// so the tests run the whole schedule without waiting for it.
//
// Isolation: one endpoint's deliveries never wait on another's. A started relay sends
// from a pool of Workers that claims again as soon as a send finishes; a claim takes
// the endpoints in turn (the oldest due of each, then the next of each) and gives no
// endpoint more than PerEndpoint minus its live leases, counted across every relay
// under a lock on the endpoints it claims for, and no more than one to an endpoint
// whose last recorded attempt did not succeed or that has none yet (a slow start). A
// receiver that never answered holds one worker, whatever its backlog; one that stops
// answering holds at most PerEndpoint until its first timeouts are recorded.
//
// Destinations: the relay's client dials through internal/netguard, which refuses
// loopback, link-local, private, CGNAT and unique local addresses (and unspecified,
// multicast and IPv4-mapped forms) when the connection is made, unless AllowNets
// lists them; registration refuses such an address literal. A tenant's own endpoints
// (CreateForTenant and the …ForTenant calls) always name their tenant, so they get
// its events only, and count against its webhook_endpoints limit.
package webhooks
