package quotas

import "time"

// Period is a tenant's billing period: monthly, starting on the day of the month of its
// billing anchor (clamped to the month's last day), at 00:00 UTC.
type Period struct {
	ID    string // "20261115": the start date; later periods have larger ids, as numbers and as text
	Start time.Time
	End   time.Time
}

func anchorDay(year int, month time.Month, day int) time.Time {
	last := time.Date(year, month+1, 0, 0, 0, 0, 0, time.UTC).Day()
	return time.Date(year, month, min(day, last), 0, 0, 0, 0, time.UTC)
}

// PeriodAt returns the billing period containing now for a tenant anchored at anchor.
func PeriodAt(anchor, now time.Time) Period {
	now = now.UTC()
	day := anchor.UTC().Day()
	start := anchorDay(now.Year(), now.Month(), day)
	if start.After(now) {
		start = anchorDay(now.Year(), now.Month()-1, day)
	}
	end := anchorDay(start.Year(), start.Month()+1, day)
	return Period{ID: start.Format("20060102"), Start: start, End: end}
}
