// Package browsertest drives Debian's headless Chromium through chromedp for the
// browser tests of the usage panel and the operator view. A test that needs a browser
// calls New; on a machine without Chromium it is skipped with the command that
// installs it, unless AGENTQ_REQUIRE_BROWSER is set (CI sets it), when it fails.
package browsertest

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Path returns the Chromium binary: $AGENTQ_CHROMIUM, else chromium or
// chromium-browser on PATH; "" when there is none.
func Path() string {
	if p := os.Getenv("AGENTQ_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// New starts a headless Chromium with a fresh profile and returns a browser context
// for chromedp.Do and chromedp.Run, cancelled (and the browser ended) when the test ends. Each call is
// its own browser, so tests run in parallel.
func New(t testing.TB) context.Context {
	t.Helper()
	path := Path()
	if path == "" {
		if os.Getenv("AGENTQ_REQUIRE_BROWSER") != "" {
			t.Fatal("no Chromium: apt-get install chromium (AGENTQ_REQUIRE_BROWSER is set)")
		}
		t.Skip("no Chromium on this machine: apt-get install chromium")
	}
	// The flags keep Chromium off the network: on a closed network its background
	// connections are refused, many at a time.
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1280, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	// Start the browser now, so a test's first action does not pay for it under its
	// own timeout.
	if err := chromedp.Do(ctx); err != nil {
		cancel()
		cancelAlloc()
		t.Fatalf("starting Chromium (%s): %v", path, err)
	}
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	return ctx
}

// Within is ctx bounded by d: one step of a browser test.
func Within(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}
