package maintenance

import (
	"context"

	"github.com/agentq/agentq/internal/store"
)

// TenantWalk bounds a pass that walks tenants: it reviews up to Batch tenants per run,
// Page per round trip, and resumes where the previous run stopped.
type TenantWalk struct {
	Batch int // tenants reviewed per run (50,000)
	Page  int // tenants read per round trip (200)
}

func (w TenantWalk) withDefaults() TenantWalk {
	w.Batch = orDefault(w.Batch, 50000)
	w.Page = min(orDefault(w.Page, 200), w.Batch)
	return w
}

// reviewPage reconciles one page of tenants, given their live tasks read from
// Postgres in one query.
type reviewPage func(ctx context.Context, tenants []string, live map[string][]store.LiveTask) error

// walkTenants walks tenants in id order from *cursor, a page per round trip, until it
// has reviewed Batch tenants, ctx ends (the budget) or it reaches the last tenant (the
// cursor then wraps to the start for the next run).
func walkTenants(ctx context.Context, st Store, w TenantWalk, cursor *string, stats *PassStats, review reviewPage) error {
	return walkTenantIDs(ctx, st, w, cursor, stats, func(ctx context.Context, ids []string) error {
		live, err := st.UnscopedLiveTasksOf(ctx, ids)
		if err != nil {
			return err
		}
		return review(ctx, ids, live)
	})
}

// walkTenantIDs is walkTenants for a pass that reads what it needs of each page itself.
func walkTenantIDs(ctx context.Context, st Store, w TenantWalk, cursor *string, stats *PassStats, review func(ctx context.Context, tenants []string) error) error {
	defer func() { stats.Cursor = *cursor }()
	for page := 0; stats.Rows < w.Batch; page++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		// The first page is reviewed whatever the budget, so a run whose budget is
		// shorter than a page's work still advances and the next run resumes past it.
		pctx := ctx
		if page == 0 {
			pctx = unbudgeted(ctx)
		}
		n := min(w.Page, w.Batch-stats.Rows)
		ids, err := st.UnscopedTenantIDsAfter(pctx, *cursor, n)
		if err != nil {
			return err
		}
		if len(ids) > 0 {
			if err := review(pctx, ids); err != nil {
				return err
			}
			stats.Rows += len(ids)
			*cursor = ids[len(ids)-1]
		}
		if len(ids) < n {
			*cursor, stats.Done = "", true
			return nil
		}
	}
	return nil
}
