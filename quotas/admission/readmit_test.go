package admission

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/quotas"
)

// ReAdmit takes a session lease for a stored task against concurrent_sessions (and
// long_running_inflight for a long-running one), counting only live leases, and keeps
// a lease the task holds already; a full limit is a *ReAdmitRefusal and takes nothing.
func TestReAdmit(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name         string
		sessions     []string // seeded leases: member, live or expired ("x:" prefix)
		long         []string
		limits       quotas.Limits
		task         string
		longRunning  bool
		spawned      bool
		refusedBy    string
		wantSessions []string
		wantLong     []string
	}{
		{name: "room", sessions: []string{"a"}, limits: quotas.Limits{Sessions: 2, LongRunning: quotas.Off}, task: "t",
			wantSessions: []string{"a", "t"}},
		{name: "full", sessions: []string{"a", "b"}, limits: quotas.Limits{Sessions: 2, LongRunning: quotas.Off}, task: "t", refusedBy: quotas.ConcurrentSessions,
			wantSessions: []string{"a", "b"}},
		{name: "expired leases do not count", sessions: []string{"a", "x:b"}, limits: quotas.Limits{Sessions: 2, LongRunning: quotas.Off}, task: "t",
			wantSessions: []string{"a", "t"}},
		{name: "held already", sessions: []string{"a", "t"}, limits: quotas.Limits{Sessions: 2, LongRunning: quotas.Off}, task: "t",
			wantSessions: []string{"a", "t"}},
		{name: "long-running counts both", sessions: []string{"a"}, long: []string{"l"}, limits: quotas.Limits{Sessions: 3, LongRunning: 1},
			task: "t", longRunning: true, refusedBy: quotas.LongRunningInflight, wantSessions: []string{"a"}, wantLong: []string{"l"}},
		{name: "long-running with room", limits: quotas.Limits{Sessions: 3, LongRunning: 1}, task: "t", longRunning: true,
			wantLong: []string{"t"}},
		{name: "spawned takes no lease, even when full", sessions: []string{"a", "b"}, limits: quotas.Limits{Sessions: 2, LongRunning: quotas.Off},
			task: "t", spawned: true, wantSessions: []string{"a", "b"}},
		{name: "spawned long-running takes none either", limits: quotas.Limits{Sessions: 3, LongRunning: 1}, task: "t", longRunning: true,
			spawned: true},
		{name: "off", sessions: []string{"a", "b"}, limits: quotas.Limits{Sessions: quotas.Off, LongRunning: quotas.Off}, task: "t",
			wantSessions: []string{"a", "b", "t"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newQ(t)
			seed := func(key string, members []string) {
				for _, m := range members {
					score := float64(f.clock() + time.Hour.Milliseconds())
					if len(m) > 2 && m[:2] == "x:" {
						m, score = m[2:], float64(f.clock()-1)
					}
					f.rdb.ZAdd(ctx, key, redis.Z{Score: score, Member: m})
				}
			}
			seed(f.keys.Sessions("acme"), tc.sessions)
			seed(f.keys.LongRunning("acme"), tc.long)
			err := f.q.ReAdmit(ctx, quotas.ReAdmitParams{TenantID: "acme", TaskID: tc.task, Limits: tc.limits, LongRunning: tc.longRunning,
				Spawned: tc.spawned})
			var refused *quotas.ReAdmitRefusal
			switch {
			case tc.refusedBy == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.refusedBy != "" && (!errors.As(err, &refused) || refused.LimitType != tc.refusedBy):
				t.Fatalf("err %v, want a refusal by %s", err, tc.refusedBy)
			}
			live := func(key string) []string {
				m, _ := f.rdb.ZRangeArgs(ctx, redis.ZRangeArgs{Key: key, ByScore: true, Start: "(" + strconv.FormatInt(f.clock(), 10), Stop: "+inf"}).Result()
				return m
			}
			if got := live(f.keys.Sessions("acme")); !sameSet(got, tc.wantSessions) {
				t.Errorf("sessions %v, want %v", got, tc.wantSessions)
			}
			if got := live(f.keys.LongRunning("acme")); !sameSet(got, tc.wantLong) {
				t.Errorf("long-running %v, want %v", got, tc.wantLong)
			}
		})
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[string]bool{}
	for _, s := range a {
		seen[s] = true
	}
	for _, s := range b {
		if !seen[s] {
			return false
		}
	}
	return true
}

// A task still in its tenant's running set (the delivery that paused it has not given
// its slot back) is refused with ErrHandOff and nothing is taken; once out of it, a
// lease it still holds becomes the resume's own, its expiry a full lease TTL away.
func TestReAdmitWaitsForTheHandOffAndOwnsTheLease(t *testing.T) {
	ctx := context.Background()
	f := newQ(t)
	limits := quotas.Limits{Sessions: 2, LongRunning: quotas.Off}
	old := float64(f.clock() + time.Minute.Milliseconds()) // the pausing delivery's lease
	f.rdb.ZAdd(ctx, f.keys.Sessions("acme"), redis.Z{Score: old, Member: "t"})
	f.rdb.SAdd(ctx, f.keys.TenantRunning("acme"), "t")
	if err := f.q.ReAdmit(ctx, quotas.ReAdmitParams{TenantID: "acme", TaskID: "t", Limits: limits}); !errors.Is(err, quotas.ErrHandOff) {
		t.Fatalf("re-admit during the hand-off: %v, want ErrHandOff", err)
	}
	if sc := f.rdb.ZScore(ctx, f.keys.Sessions("acme"), "t").Val(); sc != old {
		t.Fatalf("a refused re-admit changed the lease: %v, want %v", sc, old)
	}
	if err := f.q.ReAdmit(ctx, quotas.ReAdmitParams{TenantID: "acme", TaskID: "t", Limits: limits, Spawned: true}); !errors.Is(err, quotas.ErrHandOff) {
		t.Fatalf("a spawned task's re-admit during the hand-off: %v, want ErrHandOff", err)
	}
	f.rdb.SRem(ctx, f.keys.TenantRunning("acme"), "t")
	if err := f.q.ReAdmit(ctx, quotas.ReAdmitParams{TenantID: "acme", TaskID: "t", Limits: limits}); err != nil {
		t.Fatal(err)
	}
	if sc := f.rdb.ZScore(ctx, f.keys.Sessions("acme"), "t").Val(); sc != float64(f.clock()+leaseTTL.Milliseconds()) {
		t.Fatalf("the lease expires at %v, want a lease TTL from now (%v)", sc, f.clock()+leaseTTL.Milliseconds())
	}
}
