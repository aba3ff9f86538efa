package e2e_test

import (
	"context"

	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// redisCount is a go-redis hook counting a client's round trips (a pipeline is one),
// commands and script calls (EVAL and EVALSHA).
type redisCount struct{ trips, cmds, scripts atomic.Int64 }

func (h *redisCount) note(cmds ...redis.Cmder) {
	h.trips.Add(1)
	h.cmds.Add(int64(len(cmds)))
	for _, c := range cmds {
		if strings.HasPrefix(c.Name(), "eval") {
			h.scripts.Add(1)
		}
	}
}

func (h *redisCount) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *redisCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.note(cmd)
		return next(ctx, cmd)
	}
}

func (h *redisCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.note(cmds...)
		return next(ctx, cmds)
	}
}

// snapshot is the counts so far.
func (h *redisCount) snapshot() [3]int64 {
	return [3]int64{h.trips.Load(), h.cmds.Load(), h.scripts.Load()}
}
