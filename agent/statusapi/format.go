package statusapi

import "time"

// Millis is d in milliseconds, to the microsecond, as the documents carry durations.
func Millis(d time.Duration) float64 {
	return float64(d.Round(time.Microsecond)) / float64(time.Millisecond)
}

// UTCTime is t in UTC, nil for the zero time (left out of the document).
func UTCTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}
