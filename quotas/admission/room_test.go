package admission

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/agentq/agentq/quotas"
)

func TestQuotaRoomAgreesWithReserveStep(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	for i, c := range []struct {
		limitType   string
		limit, used int64
		next        quotas.NextStep
	}{
		{quotas.USDMonthly, 50_000, 35_000, quotas.NextStep{CostMicro: 20_000}},
		{quotas.USDMonthly, 50_000, 30_000, quotas.NextStep{CostMicro: 20_000}},
		{quotas.USDMonthly, 50_000, 49_999, quotas.NextStep{}},
		{quotas.USDMonthly, 50_000, 50_000, quotas.NextStep{}},
		{quotas.USDMonthly, 0, 0, quotas.NextStep{}},
		{quotas.AITokensMonthly, 1000, 900, quotas.NextStep{Tokens: 200}},
		{quotas.AITokensMonthly, 1000, 800, quotas.NextStep{Tokens: 200}},
		{quotas.AgentStepsDaily, 3, 3, quotas.NextStep{}},
		{quotas.AgentStepsDaily, 3, 2, quotas.NextStep{}},
	} {
		tenant := fmt.Sprintf("room-%d", i)
		used := quotas.StepParams{TenantID: tenant, Period: f.period(), Limits: quotas.NoLimits()}
		switch c.limitType {
		case quotas.USDMonthly:
			used.CostMicro = c.used
		case quotas.AITokensMonthly:
			used.Tokens = c.used
		}
		reserves := 1 // the use in one reservation; the daily steps one step at a time
		if c.limitType == quotas.AgentStepsDaily {
			reserves = int(c.used)
		}
		for range reserves {
			if err := f.q.ReserveStep(ctx, used); err != nil {
				t.Fatal(err)
			}
		}
		l := quotas.NoLimits()
		switch c.limitType {
		case quotas.USDMonthly:
			l.USDMonthlyMicro = c.limit
		case quotas.AITokensMonthly:
			l.TokensMonthly = c.limit
		case quotas.AgentStepsDaily:
			l.StepsDaily = c.limit
		}
		err := f.q.ReserveStep(ctx, quotas.StepParams{TenantID: tenant, Period: f.period(), Limits: l, Tokens: c.next.Tokens, CostMicro: c.next.CostMicro})
		var qe *quotas.QuotaExceeded
		if err != nil && !errors.As(err, &qe) {
			t.Fatal(err)
		}
		if refused, short := qe != nil, quotas.QuotaRoom(c.limitType, c.limit, c.used, c.next) != nil; refused != short {
			t.Errorf("%s %d of %d, next %+v: Redis refuses %v, the room rule %v", c.limitType, c.used, c.limit, c.next, refused, short)
		}
	}
}
