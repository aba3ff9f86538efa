package runtime

import "sync"

// tokenAverages keeps the running average of step tokens per (tenant, agent), in
// process: what a step reserves when its agent gave no next_step_tokens. Each
// worker learns its own; a fresh one starts from the agent's pool binding default.
type tokenAverages struct {
	mu  sync.Mutex
	avg map[[2]string]float64
}

// maxTokenAverages bounds the pairs kept: past it the averages start over, which
// costs a few estimates, never correctness (settlement books the difference).
const maxTokenAverages = 10_000

// tokenAverageWeight is the weight of the newest step in the average.
const tokenAverageWeight = 0.2

func newTokenAverages() *tokenAverages { return &tokenAverages{avg: map[[2]string]float64{}} }

// get returns the pair's average, and whether it has one.
func (a *tokenAverages) get(tenant, agent string) (int64, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	v, ok := a.avg[[2]string{tenant, agent}]
	return int64(v + 0.5), ok
}

// add folds one step's tokens into the pair's average.
func (a *tokenAverages) add(tenant, agent string, tokens int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := [2]string{tenant, agent}
	v, ok := a.avg[k]
	if !ok {
		if len(a.avg) >= maxTokenAverages {
			clear(a.avg)
		}
		a.avg[k] = float64(tokens)
		return
	}
	a.avg[k] = v + tokenAverageWeight*(float64(tokens)-v)
}
