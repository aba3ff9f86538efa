package quotas

import (
	"testing"
	"time"
)

func TestAnchorPeriods(t *testing.T) {
	zone := func(name string) *time.Location {
		l, err := LoadZone(name)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	ny, kolkata := zone("America/New_York"), zone("Asia/Kolkata")
	cases := []struct {
		name       string
		a          Anchor
		now        string // RFC 3339
		id         string
		start, end string // RFC 3339, UTC
	}{
		{"UTC day 15", Anchor{Day: 15}, "2026-11-30T12:00:00Z", "20261115", "2026-11-15T00:00:00Z", "2026-12-15T00:00:00Z"},
		{"UTC just before the start", Anchor{Day: 15}, "2026-11-14T23:59:59Z", "20261015", "2026-10-15T00:00:00Z", "2026-11-15T00:00:00Z"},
		{"UTC at the start", Anchor{Day: 15}, "2026-11-15T00:00:00Z", "20261115", "2026-11-15T00:00:00Z", "2026-12-15T00:00:00Z"},
		{"day 31 clamps to February's end", Anchor{Day: 31}, "2026-03-01T00:00:00Z", "20260228", "2026-02-28T00:00:00Z", "2026-03-31T00:00:00Z"},
		{"day 31 in a leap February", Anchor{Day: 31}, "2028-02-29T10:00:00Z", "20280229", "2028-02-29T00:00:00Z", "2028-03-31T00:00:00Z"},
		{"day 31 clamps to April's end", Anchor{Day: 31}, "2026-04-30T00:00:00Z", "20260430", "2026-04-30T00:00:00Z", "2026-05-31T00:00:00Z"},
		{"day 30 across February", Anchor{Day: 30}, "2026-02-15T00:00:00Z", "20260130", "2026-01-30T00:00:00Z", "2026-02-28T00:00:00Z"},
		{"year end", Anchor{Day: 1}, "2026-12-31T23:00:00Z", "20261201", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		// New York: DST starts 2026-03-08 02:00 local, so the period of March 8 starts
		// at 05:00Z (EST) and ends at 04:00Z (EDT): 31 days less an hour.
		{"DST spring", Anchor{Day: 8, Zone: ny}, "2026-03-20T00:00:00Z", "20260308", "2026-03-08T05:00:00Z", "2026-04-08T04:00:00Z"},
		{"DST fall", Anchor{Day: 1, Zone: ny}, "2026-11-15T00:00:00Z", "20261101", "2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z"},
		// 03:00Z on Nov 1 is still Oct 31 in New York: the October period.
		{"zone day before UTC's", Anchor{Day: 1, Zone: ny}, "2026-11-01T03:00:00Z", "20261001", "2026-10-01T04:00:00Z", "2026-11-01T04:00:00Z"},
		{"half-hour zone", Anchor{Day: 10, Zone: kolkata}, "2026-06-09T18:30:00Z", "20260610", "2026-06-09T18:30:00Z", "2026-07-09T18:30:00Z"},
		{"half-hour zone, a second before", Anchor{Day: 10, Zone: kolkata}, "2026-06-09T18:29:59Z", "20260510", "2026-05-09T18:30:00Z", "2026-06-09T18:30:00Z"},
		{"day 31 in a zone", Anchor{Day: 31, Zone: ny}, "2026-02-28T06:00:00Z", "20260228", "2026-02-28T05:00:00Z", "2026-03-31T04:00:00Z"},
	}
	for _, c := range cases {
		now, err := time.Parse(time.RFC3339, c.now)
		if err != nil {
			t.Fatal(err)
		}
		p := c.a.PeriodAt(now)
		if p.ID != c.id || p.Start.Format(time.RFC3339) != c.start || p.End.Format(time.RFC3339) != c.end {
			t.Errorf("%s: %s %s..%s, want %s %s..%s", c.name, p.ID, p.Start.Format(time.RFC3339), p.End.Format(time.RFC3339), c.id, c.start, c.end)
		}
		if now.Before(p.Start) || !now.Before(p.End) {
			t.Errorf("%s: %s is not in its period", c.name, c.now)
		}
		// The period starting in the month of its start is the same one.
		local := p.Start.In(c.a.zone())
		if q := c.a.PeriodStartingIn(local.Year(), local.Month()); q != p {
			t.Errorf("%s: PeriodStartingIn = %+v, want %+v", c.name, q, p)
		}
		// Periods tile time: the next one starts where this one ends.
		if next := c.a.PeriodAt(p.End); next.Start != p.End || next.ID <= p.ID {
			t.Errorf("%s: next period %+v does not follow %+v", c.name, next, p)
		}
	}
	// The UTC PeriodAt of old is the anchor of the creation's day.
	created := time.Date(2026, 1, 31, 15, 0, 0, 0, time.UTC)
	if got, want := PeriodAt(created, created.AddDate(0, 1, 0)), (Anchor{Day: 31}).PeriodAt(created.AddDate(0, 1, 0)); got != want {
		t.Errorf("PeriodAt = %+v, want %+v", got, want)
	}
}

func TestLoadZone(t *testing.T) {
	for _, ok := range []string{"", "UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata"} {
		if _, err := LoadZone(ok); err != nil {
			t.Errorf("LoadZone(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"Local", "Mars/Olympus", "../etc/passwd", "/etc/localtime", "Europe/Paris\x00"} {
		if _, err := LoadZone(bad); err == nil {
			t.Errorf("LoadZone(%q) accepted", bad)
		}
	}
}
