package agentqtype_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/agentq/agentq/agentqtype"
)

func TestTaskStates(t *testing.T) {
	for _, s := range agentqtype.TaskStates() {
		want := s != agentqtype.TaskStateQueued && s != agentqtype.TaskStateRunning && s != agentqtype.TaskStatePaused
		if !s.Valid() || s.Terminal() != want {
			t.Errorf("%s: valid %v, terminal %v", s, s.Valid(), s.Terminal())
		}
		if s.Terminal() != slices.Contains(agentqtype.TerminalTaskStates(), s) {
			t.Errorf("%s: Terminal disagrees with TerminalTaskStates", s)
		}
	}
	if agentqtype.TaskState("sleeping").Valid() || agentqtype.TaskState("sleeping").Terminal() {
		t.Error("an unknown state passes")
	}
	// The lists are copies: a caller cannot change what Terminal answers.
	agentqtype.TerminalTaskStates()[0] = agentqtype.TaskStateRunning
	if agentqtype.TaskState(agentqtype.TaskStateRunning).Terminal() {
		t.Error("changing a returned list changed the states")
	}
}

func TestRefusalsMatchThroughWrapping(t *testing.T) {
	err := errors.Join(errors.New("context"), &agentqtype.SuspendedError{TenantID: "acme"})
	var suspended *agentqtype.SuspendedError
	if !errors.As(err, &suspended) || suspended.TenantID != "acme" || suspended.Error() != "tenant acme is suspended" {
		t.Errorf("errors.As: %v", err)
	}
}

func TestWaitReasons(t *testing.T) {
	for _, c := range []struct {
		r                  agentqtype.WaitReason
		want               string
		pool, throttledFor string
		isPool, throttled  bool
	}{
		{r: agentqtype.WaitTokensPerMinute, want: "tokens_per_minute"},
		{r: agentqtype.WaitPool("shared"), want: "pool:shared", pool: "shared", isPool: true},
		{r: agentqtype.WaitThrottled("shared"), want: "throttled:shared", throttledFor: "shared", throttled: true},
		{r: agentqtype.WaitThrottled(""), want: "throttled", throttled: true},
		{r: "pool:", want: "pool:"},
		{r: "throttled:", want: "throttled:"},
	} {
		pool, isPool := c.r.Pool()
		th, throttled := c.r.Throttled()
		if string(c.r) != c.want || pool != c.pool || isPool != c.isPool || th != c.throttledFor || throttled != c.throttled {
			t.Errorf("%q: Pool() %q %v, Throttled() %q %v; want %q, %q %v, %q %v", c.r, pool, isPool, th, throttled,
				c.want, c.pool, c.isPool, c.throttledFor, c.throttled)
		}
	}
}

// Every service's missing thing matches the one sentinel, through wrapping, and keeps
// the sentence the API answers with.
func TestNotFoundMatchesTheSentinel(t *testing.T) {
	err := fmt.Errorf("get pool: %w", &agentqtype.NotFoundError{What: "pool", Name: "llm", Message: `No pool "llm".`})
	var nf *agentqtype.NotFoundError
	if !errors.Is(err, agentqtype.ErrNotFound) || !errors.As(err, &nf) || nf.Error() != `No pool "llm".` {
		t.Errorf("%v: not a NotFoundError matching ErrNotFound", err)
	}
	if errors.Is(errors.New("not found"), agentqtype.ErrNotFound) {
		t.Error("another error matches ErrNotFound")
	}
	inv := agentqtype.Invalid("weight", "Field weight must be between %d and %d.", 1, 100)
	if inv.Field != "weight" || inv.Error() != "Field weight must be between 1 and 100." || inv.NotJSON {
		t.Errorf("Invalid: %+v", inv)
	}
}
