package quotas

import (
	"errors"
	"fmt"
	"sync"
	"time"
	_ "time/tzdata" // zone names resolve the same on every machine, with or without a system zoneinfo
)

// Period is a tenant's billing period: monthly, starting at 00:00 in the tenant's time
// zone (UTC unless it set one) on its billing day of the month (clamped to the month's
// last day).
type Period struct {
	ID    string // "20261115": the start date in the tenant's zone; later periods have larger ids, as numbers and as text
	Start time.Time
	End   time.Time
}

// Anchor is a tenant's billing anchor: the day of the month its periods start on and
// the zone whose midnight starts them. The zero Anchor is day 1 in UTC.
type Anchor struct {
	// Day is 1 to 31; a month without that day starts its period on its last day.
	Day int
	// Zone is the tenant's time zone; nil is UTC.
	Zone *time.Location
}

func (a Anchor) zone() *time.Location {
	if a.Zone == nil {
		return time.UTC
	}
	return a.Zone
}

// ZoneName is the IANA name of the anchor's zone ("UTC" for nil).
func (a Anchor) ZoneName() string { return a.zone().String() }

func (a Anchor) day() int { return min(max(a.Day, 1), 31) }

// startIn is the period start in year/month: 00:00 on the anchor day clamped to the
// month's last day.
func (a Anchor) startIn(year int, month time.Month) time.Time {
	loc := a.zone()
	last := time.Date(year, month+1, 0, 0, 0, 0, 0, time.UTC).Day()
	return time.Date(year, month, min(a.day(), last), 0, 0, 0, 0, loc)
}

// PeriodAt returns the billing period containing now.
func (a Anchor) PeriodAt(now time.Time) Period {
	local := now.In(a.zone())
	start := a.startIn(local.Year(), local.Month())
	if start.After(now) {
		start = a.startIn(local.Year(), local.Month()-1)
	}
	return a.period(start)
}

// PeriodOf returns the billing period whose id is id (Period.ID), false if id is not
// one. A period the anchor no longer starts (its day or zone changed since) is the
// period holding the day id names.
func (a Anchor) PeriodOf(id string) (Period, bool) {
	day, err := time.ParseInLocation("20060102", id, a.zone())
	if err != nil {
		return Period{}, false
	}
	return a.PeriodAt(day), true
}

// PeriodStartingIn returns the billing period that starts in year/month (in the
// anchor's zone): every month holds exactly one period start.
func (a Anchor) PeriodStartingIn(year int, month time.Month) Period {
	return a.period(a.startIn(year, month))
}

func (a Anchor) period(start time.Time) Period {
	end := a.startIn(start.Year(), start.Month()+1)
	return Period{ID: start.Format("20060102"), Start: start.UTC(), End: end.UTC()}
}

// PeriodAt returns the billing period containing now for a tenant anchored at anchor
// in UTC: its periods start on anchor's day of the month at 00:00 UTC.
func PeriodAt(anchor, now time.Time) Period {
	return Anchor{Day: anchor.UTC().Day()}.PeriodAt(now)
}

// ErrZone: a time zone name is not an IANA zone this build knows.
var ErrZone = errors.New("not a known IANA time zone")

var zones sync.Map // name → *time.Location

// LoadZone resolves an IANA time zone name ("Europe/Paris", "UTC"); "" is UTC.
// "Local" (the machine's zone, not the tenant's) is refused. Resolved zones are
// cached: a step's billing period is worked out on every step.
func LoadZone(name string) (*time.Location, error) {
	if name == "" || name == "UTC" {
		return time.UTC, nil
	}
	if l, ok := zones.Load(name); ok {
		return l.(*time.Location), nil
	}
	if name == "Local" || len(name) > 64 {
		return nil, fmt.Errorf("%q: %w", name, ErrZone)
	}
	l, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", name, ErrZone)
	}
	zones.Store(name, l)
	return l, nil
}
