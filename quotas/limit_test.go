package quotas

import (
	"encoding/json"
	"testing"
)

// refUnmarshal is Limit's JSON decoding without its fast path for numbers: the
// general decoding, which every value took before.
func refUnmarshal(b []byte) (Limit, error) {
	var l Limit
	err := l.unmarshalAnyJSON(b)
	return l, err
}

// Overrides as the store decodes them (a JSON object of limits) read the same with the
// fast path for numbers as without it, whatever the values.
func FuzzLimitJSON(f *testing.F) {
	for _, seed := range []string{`0`, `1`, `-1`, `-0`, `2.5`, `1e3`, `1E+2`, `1e-7`, `1e400`, `-1e400`,
		`100000000`, `"unlimited"`, `"Unlimited"`, `"5"`, `null`, `true`, `[]`, `{}`, `"\u0075nlimited"`,
		`0.0000001`, `123456789012345678901234567890`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		if !json.Valid([]byte(v)) {
			return
		}
		var got map[string]Limit
		gotErr := json.Unmarshal([]byte(`{"x":`+v+`}`), &got)
		want, wantErr := refUnmarshal([]byte(v))
		if (gotErr != nil) != (wantErr != nil) {
			t.Fatalf("%s: error %v, before %v", v, gotErr, wantErr)
		}
		if gotErr == nil && got["x"] != want {
			t.Fatalf("%s: %v, before %v", v, got["x"], want)
		}
	})
}

// refLimit decodes as Limit did before its fast path, for the benchmark's baseline.
type refLimit Limit

func (l *refLimit) UnmarshalJSON(b []byte) error {
	v, err := refUnmarshal(b)
	*l = refLimit(v)
	return err
}

// The overrides of a tenant with ten limits raised, as scanTenant decodes them.
const benchOverrides = `{"concurrent_sessions": 1000000, "user_tasks_hourly": 100000000, "queue_backlog": 1000000,
	"agent_steps_daily": 100000000, "tenant_rate": 1000000, "tenant_rate_burst": 1000000, "running": 1000,
	"long_running_inflight": 1000000, "key_rate": 1000000, "key_rate_burst": "unlimited"}`

func BenchmarkOverridesJSON(b *testing.B) {
	b.Run("limit", func(b *testing.B) {
		for b.Loop() {
			var m map[string]Limit
			if err := json.Unmarshal([]byte(benchOverrides), &m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("before", func(b *testing.B) {
		for b.Loop() {
			var m map[string]refLimit
			if err := json.Unmarshal([]byte(benchOverrides), &m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
