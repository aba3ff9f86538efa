package telemetry

import (
	"cmp"
	"slices"
)

// OtherLabel is the label value that stands for every tenant beyond the top N of a
// per-tenant gauge, so that its cardinality stays bounded however many tenants
// there are.
const OtherLabel = "other"

// TopTenants is how many tenants a per-tenant gauge names; the rest are "other".
const TopTenants = 20

// TopN splits the keys of vals into the n with the largest values (ties by name)
// and the rest.
func TopN(vals map[string]float64, n int) (top, rest []string) {
	keys := make([]string, 0, len(vals))
	for k := range vals {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if c := cmp.Compare(vals[b], vals[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	if len(keys) <= n {
		return keys, nil
	}
	return keys[:n], keys[n:]
}
