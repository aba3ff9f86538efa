package main

import (
	"runtime/debug"
	"testing"
)

func TestTuneGCRaisesTheTargetUnlessGOGCIsSet(t *testing.T) {
	was := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(was) })

	if !tuneGC(func(string) string { return "" }) {
		t.Fatal("tuneGC left the target alone with GOGC unset")
	}
	if got := debug.SetGCPercent(100); got != gcPercent {
		t.Errorf("GOGC unset: target %d, want %d", got, gcPercent)
	}
	env := map[string]string{"GOGC": "100"}
	if tuneGC(func(k string) string { return env[k] }) {
		t.Error("tuneGC changed the target although GOGC is set")
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GOGC=100 in the environment: target %d, want 100 as set", got)
	}
}
