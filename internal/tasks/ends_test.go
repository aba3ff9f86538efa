package tasks_test

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tasks/change"
	"github.com/agentq/agentq/internal/wire"
	"github.com/agentq/agentq/quotas"
)

// listen subscribes to task id's progress stream and returns its messages' channel.
func (e env) listen(t *testing.T, id uuid.UUID) <-chan *redis.Message {
	t.Helper()
	sub := e.rdb.Subscribe(context.Background(), e.rk.TaskEvents(id.String()))
	t.Cleanup(func() { _ = sub.Close() })
	if _, err := sub.Receive(context.Background()); err != nil {
		t.Fatal(err)
	}
	return sub.Channel()
}

// stateMessage waits for the next state message on ch.
func stateMessage(t *testing.T, ch <-chan *redis.Message) wire.Progress {
	t.Helper()
	select {
	case m := <-ch:
		var p wire.Progress
		if err := json.Unmarshal([]byte(m.Payload), &p); err != nil || p.Type != "state" {
			t.Fatalf("progress message %s: %v", m.Payload, err)
		}
		return p
	case <-time.After(5 * time.Second):
		t.Fatal("no state message")
	}
	return wire.Progress{}
}

// sessions are the tasks holding a session lease of tenant.
func (e env) sessions(t *testing.T, tenant string) []string {
	t.Helper()
	s, _, err := e.deps.Admission.Quotas().LeaseMembers(context.Background(), []string{tenant})
	if err != nil {
		t.Fatal(err)
	}
	return s[0]
}

// A cancel's end is followed by the one end effect: the lease goes back, and the
// progress stream hears the end with the reason the task's row holds.
func TestCancelIsFollowedByItsEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, "acme")
	res, err := e.svc.Submit(ctx, tasks.SubmitParams{TenantID: "acme", Kid: "k1", Agent: "sim"})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.sessions(t, "acme"); !slices.Contains(got, res.Task.ID.String()) {
		t.Fatalf("sessions %v: the submission holds no lease", got)
	}
	msgs := e.listen(t, res.Task.ID)
	if _, err := e.svc.Cancel(ctx, "acme", res.Task.ID); err != nil {
		t.Fatal(err)
	}
	m := stateMessage(t, msgs)
	if m.TaskID != res.Task.ID.String() || m.State != string(agentqtype.TaskStateKilled) || m.Error != agentqtype.CancelledByTenant() {
		t.Fatalf("end message %+v", m)
	}
	if got := e.sessions(t, "acme"); slices.Contains(got, res.Task.ID.String()) {
		t.Fatalf("sessions %v: the cancelled task keeps its lease", got)
	}
}

// A pause past its plan's timeout ends with one reason, the same in the task's row and
// in its progress stream.
func TestPauseTimeoutEndsWithOneReason(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, "acme")
	id := e.pausedTask(t, "acme", quotas.TaskMaxCostUSD, 1_000_000, 1_000_000, 25*time.Hour)
	msgs := e.listen(t, id)
	if res, err := e.svc.SweepPauses(ctx, tasks.NewPauseMarks()); err != nil || res.Expired != 1 {
		t.Fatalf("sweep: %+v %v", res, err)
	}
	want := agentqtype.PauseTimedOut(quotas.TaskMaxCostUSD)
	if got := e.state(t, "acme", id); got.State != agentqtype.TaskStateBudgetExceeded || got.Error == nil || *got.Error != want {
		t.Fatalf("expired pause: %s, %v; want %q", got.State, got.Error, want)
	}
	if m := stateMessage(t, msgs); m.State != string(agentqtype.TaskStateBudgetExceeded) || m.Error != want {
		t.Fatalf("end message %+v, want the reason %q", m, want)
	}
}

// A start of a group commit is told to its subscribers as a start alone is: what
// writes with a start runs in its transaction (its failure leaves the task queued),
// and what follows it runs once, after the commit, in the starting call.
func TestGroupStartIsToldAsAStartAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, "acme")
	var mu sync.Mutex
	fail := true
	var followed []change.Change
	lc := tasks.NewLifecycle(e.st, tasks.LifecycleOptions{Subscribers: []tasks.Subscriber{change.Funcs{
		Kinds: []tasks.ChangeKind{tasks.ChangeStarted},
		Tx: func(ctx context.Context, tx *store.Store, c change.Change) error {
			// The start is visible on tx: it is the start's transaction.
			got, err := tx.GetTask(ctx, store.GetTaskParams{TenantID: c.Task.TenantID, ID: c.Task.ID})
			if err != nil || got.State != agentqtype.TaskStateRunning {
				t.Errorf("on the start's transaction: %s %v", got.State, err)
			}
			mu.Lock()
			defer mu.Unlock()
			if fail {
				return errHook
			}
			return nil
		},
		Followed: func(_ context.Context, c change.Change) {
			if c.Kind != tasks.ChangeStarted {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			followed = append(followed, c)
		},
	}}})
	id := uuid.Must(uuid.NewV7())
	if _, _, err := lc.Create(ctx, store.InsertTaskParams{ID: id, TenantID: "acme", Kid: "k1", Agent: "sim",
		Input: json.RawMessage(`{}`), Budget: json.RawMessage(`{}`), RequestHash: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	// The shared start fails with its subscriber; the start alone then fails the same way.
	if _, _, err := lc.Start(ctx, id); err == nil {
		t.Fatal("a start whose subscriber failed in its transaction started")
	}
	if got := e.state(t, "acme", id); got.State != agentqtype.TaskStateQueued {
		t.Fatalf("after a failed start: %s", got.State)
	}
	mu.Lock()
	fail = false
	if len(followed) != 0 {
		t.Fatalf("a start that rolled back was followed: %+v", followed)
	}
	mu.Unlock()
	task, out, err := lc.Start(ctx, id)
	if err != nil || out != tasks.Started {
		t.Fatalf("start: %v %v", out, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(followed) != 1 || followed[0].Kind != tasks.ChangeStarted || followed[0].Task.ID != task.ID ||
		followed[0].From != agentqtype.TaskStateQueued {
		t.Fatalf("followed %+v, want the one start", followed)
	}
}
