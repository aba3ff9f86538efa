package browsertest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The browser renders a local page and runs its script.
func TestBrowserRendersALocalPage(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `<!doctype html><p id="x">before</p><script>document.getElementById("x").textContent = "after"</script>`)
	}))
	defer srv.Close()
	ctx, cancel := Within(New(t), 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL)); err != nil {
		t.Fatal(err)
	}
	text, err := chromedp.Run(ctx, chromedp.Text("#x"))
	if err != nil {
		t.Fatal(err)
	}
	if text != "after" {
		t.Fatalf("text %q, want after", text)
	}
}
