package baseservice

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestNilArchetypeHasDefaults(t *testing.T) {
	t.Parallel()
	var a *Archetype
	d := a.Defaults()
	if d.Logger == nil || d.TracerProvider == nil || d.MeterProvider == nil || d.Clock == nil {
		t.Fatalf("defaults left a field unset: %+v", d)
	}
	if got := a.Now(); time.Since(got) > time.Minute {
		t.Fatalf("nil archetype's clock = %v, want about now", got)
	}
}

func TestDefaultsKeepWhatIsSet(t *testing.T) {
	t.Parallel()
	fixed := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	var buf bytes.Buffer
	a := &Archetype{Clock: func() time.Time { return fixed }, Logger: slog.New(slog.NewTextHandler(&buf, nil))}
	d := a.Defaults()
	if !d.Now().Equal(fixed) || !a.Now().Equal(fixed) {
		t.Fatalf("clock not kept: %v", d.Now())
	}
	a.WithLogger("service", "relay").Logger.Info("hello")
	if !strings.Contains(buf.String(), "service=relay") {
		t.Fatalf("WithLogger lost the attributes or the logger: %q", buf.String())
	}
	if a.Logger == d.Logger && d == a {
		t.Fatal("Defaults returned the same archetype, want a copy")
	}
}
