package quotas

import (
	"context"
	"time"
)

// UsageSource reads what a tenant used from the system of record, the usage ledger.
type UsageSource interface {
	// PeriodUsage returns the tenant's steps per hour over the 24 hours before now, and
	// its tokens and micro-dollars recorded in period.
	PeriodUsage(ctx context.Context, tenantID string, period Period, now time.Time) (Usage, error)
}

// Usage is a tenant's use as the ledger has it.
type Usage struct {
	// StepsByHour maps an hour (hours since the Unix epoch) to the steps recorded in
	// it. Hours outside the sliding day are ignored.
	StepsByHour map[int64]int64
	Tokens      int64 // in the billing period
	CostMicro   int64 // in the billing period, micro-dollars
}

// InFlight is what a tenant's running tasks may hold reserved in its counters and not
// yet recorded in the ledger.
type InFlight struct {
	Steps, Tokens, CostMicro int64
}

// LedgerCounts is what the ledger says a tenant's counters should hold.
type LedgerCounts struct {
	Period   Period // the tenant's current billing period
	Usage    Usage
	InFlight InFlight
}

// CounterSnapshot is a tenant's counters as the recount first read them.
type CounterSnapshot struct {
	TenantID string
	Seeded   bool // unseeded counters are left to the next admission's seed
	// Fingerprint is what the correction compares, to know nothing moved since.
	Fingerprint string
}

// Correction pairs a snapshot with the ledger's view read after it.
type Correction struct {
	Snapshot CounterSnapshot
	Ledger   LedgerCounts
	// Held: the snapshot was taken, and the ledger read after it, while the ledger
	// held still (its reader holds the tenant's step records back until the correction
	// is made). The counters are corrected by the drift the snapshot shows against the
	// ledger, and whatever moved since the snapshot (a reservation, a settlement) is
	// kept on top: it is no drift, and the correction commutes with it.
	Held bool
}

// RecountOutcome says what the recount (admission.Recounter.CorrectCounters) did with a tenant.
type RecountOutcome int

// Outcomes of a recount.
const (
	RecountInLine    RecountOutcome = iota // within what the ledger and the reservations allow
	RecountCorrected                       // moved to the nearer bound
	RecountBusy                            // the counters moved since the snapshot: left for the next run
	RecountUnseeded                        // lost meanwhile: the next admission seeds them
)

// RecountResult is what the recount did with one tenant: the outcome, and by how
// much it moved each counter (the 24 h steps, the period's tokens and micro-dollars).
type RecountResult struct {
	TenantID                 string
	Outcome                  RecountOutcome
	Steps, Tokens, CostMicro int64
}
