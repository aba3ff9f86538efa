package runtime

import (
	"slices"
	"testing"
)

func TestFetcherSharesSplitTheSlots(t *testing.T) {
	for _, c := range []struct {
		concurrency, fetchers int
		want                  []int
	}{
		{20, 4, []int{5, 5, 5, 5}},
		{10, 4, []int{3, 3, 2, 2}},
		{2, 4, []int{1, 1}}, // never a server without a slot
		{1, 1, []int{1}},
		{5, 0, []int{5}}, // unset: one server, as asynq alone
		{7, 1, []int{7}},
	} {
		if got := fetcherShares(c.concurrency, c.fetchers); !slices.Equal(got, c.want) {
			t.Errorf("fetcherShares(%d, %d) = %v, want %v", c.concurrency, c.fetchers, got, c.want)
		}
	}
}
