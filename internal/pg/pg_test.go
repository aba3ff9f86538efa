package pg_test

import (
	"context"
	"strings"
	"testing"

	"github.com/agentq/agentq/internal/pg"
	"github.com/agentq/agentq/internal/testenv"
)

// Connections run their statements' generic plans, unless the URL says otherwise.
func TestConnectAsksForGenericPlansUnlessTheURLNamesAMode(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct{ suffix, want string }{
		{"", "force_generic_plan"},
		{"plan_cache_mode=auto", "auto"},
	} {
		url := testenv.DatabaseURL()
		if c.suffix != "" {
			sep := "?"
			if strings.Contains(url, "?") {
				sep = "&"
			}
			url += sep + c.suffix
		}
		pool, err := pg.Connect(ctx, url, "")
		if err != nil {
			t.Fatal(err)
		}
		var got string
		err = pool.QueryRow(ctx, `SHOW plan_cache_mode`).Scan(&got)
		pool.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("URL suffix %q: plan_cache_mode %q, want %q", c.suffix, got, c.want)
		}
	}
}
