package maintenance

import (
	"context"
	"errors"
	"testing"
)

type flushFunc func(ctx context.Context) (int, int, error)

func (f flushFunc) FlushRejections(ctx context.Context) (int, int, error) { return f(ctx) }

// The refusal-count flush runs alone through runOnce and reports what the flusher
// copied; a failed flush is reported as the pass's error; without a flusher it does
// nothing.
func TestRejectionFlushRunsOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	calls := 0
	d := f.Deps
	d.Rejections = flushFunc(func(ctx context.Context) (int, int, error) {
		calls++
		if calls == 2 {
			return 0, 0, errors.New("postgres is down")
		}
		return 3, 1, nil
	})
	p := NewRejectionFlush(d, NewElector(d, ElectorConfig{}), RejectionFlushConfig{})
	if res, err := p.runOnce(f.ctx); err != nil || res.Rows != 3 || res.Events != 1 || !res.Stats.Done {
		t.Fatalf("first run %+v %v", res, err)
	}
	if res, err := p.runOnce(f.ctx); err == nil || res.Stats.Done || res.Stats.Err == "" {
		t.Fatalf("a failed flush: %+v %v", res, err)
	}
	d.Rejections = nil
	off := NewRejectionFlush(d, NewElector(d, ElectorConfig{}), RejectionFlushConfig{})
	if res, err := off.runOnce(f.ctx); err != nil || !res.Stats.Done || res.Rows != 0 {
		t.Fatalf("without a flusher %+v %v", res, err)
	}
}
