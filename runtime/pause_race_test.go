package runtime_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/runtime"
)

// pauseHook runs onPause the instant a task's pause is written, before the delivery
// that paused it goes on: what onPause does lands in that delivery's hand-off.
type pauseHook struct {
	runtime.Lifecycle
	onPause func(store.Task)
}

func (h pauseHook) Pause(ctx context.Context, p tasks.PauseParams) (store.Task, error) {
	t, err := h.Lifecycle.Pause(ctx, p)
	if err == nil {
		h.onPause(t)
	}
	return t, err
}

// resumeRace is what TestResumeDuringThePausingHandOff records.
type resumeRace struct {
	mu       sync.Mutex
	resumed  map[uuid.UUID]time.Time // resumed, next step not run yet
	waits    []time.Duration         // from each resume to the task's next step
	refused  int                     // resumes whose first try the hand-off refused
	resumes  int
	retrying sync.WaitGroup
}

// A resume fired the instant a task reads paused, inside the hand-off of the delivery
// that paused it, is refused with "retry" while that delivery still holds the task's
// dispatch slot; the retry resumes it. 200 times over: every task completes, none
// waits past a second from its resume to its next step, and every step runs under
// its task's own session lease, so its tenant's sessions never pass the cap.
func TestResumeDuringThePausingHandOff(t *testing.T) {
	t.Parallel()
	const tasksN, pausesEach, sessions = 8, 25, 8
	rr := &resumeRace{resumed: map[uuid.UUID]time.Time{}}
	ctx := context.Background()
	var r *rig
	resume := func(task store.Task) error {
		// The resume's time is noted before the call: the resumed step can run
		// before the call returns. The task is paused until the resume commits, so
		// no step of it finds a note of a resume that is then refused.
		rr.mu.Lock()
		rr.resumed[task.ID] = time.Now()
		rr.mu.Unlock()
		// Each resume allows one more step of $0.01.
		_, err := r.svc.Resume(ctx, tasks.ResumeParams{TenantID: tenant, ID: task.ID,
			Budget: &tasks.BudgetRequest{MaxCostUSD: ptr(float64(task.Usage.CostMicroUSD+10_000) / 1e6)}})
		rr.mu.Lock()
		if err == nil {
			rr.resumes++
		} else {
			delete(rr.resumed, task.ID)
		}
		rr.mu.Unlock()
		return err
	}
	// A worker slot per task: a resumed task never waits behind another for a slot.
	r = newRigWith(t, tasks.LifecycleOptions{}, tasksN, func(_ *rig, lc runtime.Lifecycle) runtime.Lifecycle {
		return pauseHook{Lifecycle: lc, onPause: func(task store.Task) {
			err := resume(task)
			var handOff *tasks.HandOffError
			switch {
			case err == nil:
				return
			case !errors.As(err, &handOff):
				t.Errorf("a resume in the hand-off: %v, want a hand-off refusal", err)
				return
			}
			rr.mu.Lock()
			rr.refused++
			rr.mu.Unlock()
			rr.retrying.Add(1)
			go func() { // as a client honouring Retry-After, sooner
				defer rr.retrying.Done()
				for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
					err := resume(task)
					if err == nil {
						return
					}
					if !errors.As(err, &handOff) || time.Now().After(end) {
						t.Errorf("retrying the resume of %s: %v", task.ID, err)
						return
					}
				}
			}()
		}}
	})
	plan := "enterprise" // its ceilings allow the steps
	if _, err := r.st.UpdateTenant(ctx, store.UpdateTenantParams{ID: tenant, Plan: &plan}); err != nil {
		t.Fatal(err)
	}
	r.setOverrides(map[string]quotas.Limit{quotas.ConcurrentSessions: sessions})
	count := counter(t)
	r.agents.Register("race", stepFunc(func(ctx context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
		id := uuid.MustParse(req.TaskID)
		sess, long, err := r.q.Leases(ctx, tenant)
		if err != nil || len(sess) > sessions || !slices.Contains(sess, req.TaskID) {
			t.Errorf("step %d of %s runs with the tenant's sessions %v %v (%v): want its own lease among at most %d",
				req.Step, id, sess, long, err, sessions)
		}
		rr.mu.Lock()
		if at, ok := rr.resumed[id]; ok {
			rr.waits = append(rr.waits, time.Since(at))
			delete(rr.resumed, id)
		}
		rr.mu.Unlock()
		return count(ctx, req)
	}))
	r.start()
	ids := make([]uuid.UUID, tasksN)
	for i := range ids {
		ids[i] = r.submit("race", `{"steps":26,"cost_usd":0.01}`, &tasks.BudgetRequest{MaxCostUSD: ptr(0.01)})
	}
	rr.waitAll(t, r, ids)
	rr.retrying.Wait()
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.resumes != tasksN*pausesEach || rr.refused != rr.resumes {
		t.Fatalf("%d resumes, %d refused at first; want %d, each first refused in the hand-off", rr.resumes, rr.refused, tasksN*pausesEach)
	}
	slices.Sort(rr.waits)
	longest := rr.waits[len(rr.waits)-1]
	t.Logf("%d resumes; wait from a resume to the next step: median %v, p99 %v, longest %v", len(rr.waits),
		rr.waits[len(rr.waits)/2], rr.waits[len(rr.waits)*99/100], longest)
	if len(rr.waits) != tasksN*pausesEach || longest > time.Second {
		t.Fatalf("%d steps after a resume, the longest %v after it; want %d, none past a second", len(rr.waits), longest, tasksN*pausesEach)
	}
	for _, id := range ids {
		r.wantReleased(id)
	}
}

// waitAll waits until every task completed, failing as soon as a resumed task has
// waited five seconds for its next step.
func (rr *resumeRace) waitAll(t *testing.T, r *rig, ids []uuid.UUID) {
	t.Helper()
	for end := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		done := 0
		for _, id := range ids {
			got := r.task(id)
			switch got.State {
			case agentqtype.TaskStateCompleted:
				if got.Usage.Steps != 26 {
					t.Fatalf("task %s completed after %d steps, want 26", id, got.Usage.Steps)
				}
				done++
			case agentqtype.TaskStateQueued, agentqtype.TaskStateRunning, agentqtype.TaskStatePaused:
			default:
				t.Fatalf("task %s is %s: %s; log:\n%s", id, got.State, deref(got.Error), r.log)
			}
		}
		if done == len(ids) {
			return
		}
		rr.mu.Lock()
		for id, at := range rr.resumed {
			if time.Since(at) > 5*time.Second {
				rr.mu.Unlock()
				t.Fatalf("task %s resumed %v ago never ran again (%s)", id, time.Since(at), r.task(id).State)
			}
		}
		rr.mu.Unlock()
		if time.Now().After(end) {
			t.Fatalf("%d of %d tasks completed", done, len(ids))
		}
	}
}

// A tenant's paused tasks are bounded by its plan's paused_tasks: a task that meets a
// limit while its tenant has that many paused stops there instead (budget_exceeded),
// its error saying it was not paused and why, and holds nothing.
func TestPauseAtThePausedTasksBoundStops(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.setOverrides(map[string]quotas.Limit{quotas.PausedTasks: 1})
	r.agents.Register("counter", counter(t))
	r.start()
	first := r.submit("counter", `{"steps":3,"cost_usd":0.01}`, &tasks.BudgetRequest{MaxCostUSD: ptr(0.01)})
	if got := r.waitState(first, agentqtype.TaskStatePaused); got.Usage.Steps != 1 {
		t.Fatalf("first task paused after %d steps, want 1", got.Usage.Steps)
	}
	second := r.submit("counter", `{"steps":3,"cost_usd":0.01}`, &tasks.BudgetRequest{MaxCostUSD: ptr(0.01)})
	got := r.waitState(second, agentqtype.TaskStateBudgetExceeded)
	if got.Usage.Steps != 1 || !strings.Contains(deref(got.Error), "max_cost_usd") || !strings.Contains(deref(got.Error), "paused_tasks 1") {
		t.Fatalf("second task: %d steps, error %q; want stopped at max_cost_usd, naming paused_tasks 1", got.Usage.Steps, deref(got.Error))
	}
	r.wantReleased(second)
	if got := r.task(first); got.State != agentqtype.TaskStatePaused {
		t.Fatalf("the first task is %s, want still paused", got.State)
	}
}
