package admission

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
)

// BenchmarkAdmit measures one full admission (every scope on, all passing) per
// operation, alone and coalesced; `agentq bench admission` is the comparative run.
func BenchmarkAdmit(b *testing.B) {
	rdb, keys := testenv.Redis(b, 1)
	lim := quotas.Limits{
		KeyRate: 1e6, KeyBurst: 1e6, TenantRate: 1e6, TenantBurst: 1e6, KeyAgentRate: 1e6, KeyAgentBurst: 1e6,
		UserHourly: 1e9, UserBurst: 1e9, Sessions: 1e9, LongRunning: 1e9, Backlog: 1e9,
		StepsDaily: 1e9, TokensMonthly: 1e12, USDMonthlyMicro: 1e12,
	}
	period := quotas.PeriodAt(time.Now(), time.Now())
	for _, coalesced := range []bool{false, true} {
		b.Run(fmt.Sprintf("coalesced=%v", coalesced), func(b *testing.B) {
			q := New(rdb, keys, nil, Options{Coalesce: coalesced, CoalesceTimeout: time.Second})
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					i++
					_, err := q.Admit(context.Background(), quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: fmt.Sprint("t", i%50), Kid: "k",
						Agent: "sim", User: fmt.Sprint("u", i%20), TaskID: fmt.Sprint(i), InScope: true, LongRunning: true, Limits: lim, Period: period})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
