package k8s

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// streamReport is what `probe stream` prints last.
type streamReport struct {
	LongestStallMs int64    `json:"longestStallMs"`
	Reconnects     int      `json:"reconnects"`
	Received       uint64   `json:"received"`
	Lost           uint64   `json:"lost"`
	Errors         []string `json:"errors"`
	// LongestStallEnd is when the longest stall ended, by the probe's clock (the machine's).
	LongestStallEnd time.Time `json:"longestStallEnd"`
}

// longestStall is the window of the longest stall; zero times when the probe did not say.
func (r streamReport) longestStall() (from, to time.Time) {
	if r.LongestStallEnd.IsZero() {
		return time.Time{}, time.Time{}
	}
	return r.LongestStallEnd.Add(-time.Duration(r.LongestStallMs) * time.Millisecond), r.LongestStallEnd
}

// startStream runs `/probe stream` for d from east's worker pod to addr (west's pod, across the
// cable), and sleeps 5 s so the stream is under way before what it measures starts. wait ends
// the test if the stream failed or printed no report, and returns the report.
func (m *mesh) startStream(t *testing.T, d time.Duration, addr string) (wait func() streamReport) {
	t.Helper()
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := m.kc("east", "", "-n", "demo", "exec", "client-worker", "--", "/probe", "stream", "-for", d.String(), addr)
		done <- result{out, err}
	}()
	time.Sleep(5 * time.Second)
	return func() streamReport {
		t.Helper()
		r := <-done
		if r.err != nil {
			t.Fatalf("probe stream: %v\n%s", r.err, r.out)
		}
		rep, err := parseStreamReport(r.out)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
}

// parseStreamReport reads the report `probe stream` prints as its last line.
func parseStreamReport(out string) (streamReport, error) {
	var rep streamReport
	if err := json.Unmarshal([]byte(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:]), &rep); err != nil {
		return rep, fmt.Errorf("probe stream printed %q: %w", out, err)
	}
	return rep, nil
}

func TestParseStreamReportReadsTheStallWindow(t *testing.T) {
	rep, err := parseStreamReport(`{"longestStallMs":1500,"longestStallEnd":"2026-11-28T14:20:03.5Z"}` + "\n")
	if err != nil {
		t.Fatal(err)
	}
	from, to := rep.longestStall()
	if want := time.Date(2026, 11, 28, 14, 20, 2, 0, time.UTC); !from.Equal(want) || !to.Equal(want.Add(1500*time.Millisecond)) {
		t.Errorf("stall window %v - %v, want it to start at %v and last 1.5 s", from, to, want)
	}
	if rep, err := parseStreamReport(`{"longestStallMs":20}` + "\n"); err != nil || !rep.LongestStallEnd.IsZero() {
		t.Errorf("a report without the stall's end (an older probe): %+v, %v", rep, err)
	}
}

func TestParseStreamReportReadsTheLastLine(t *testing.T) {
	rep, err := parseStreamReport("connected\n{\"longestStallMs\":1733,\"reconnects\":0,\"received\":5813,\"lost\":2,\"errors\":[\"x\"]}\n")
	if err != nil || rep.LongestStallMs != 1733 || rep.Received != 5813 || rep.Lost != 2 || len(rep.Errors) != 1 {
		t.Errorf("report %+v, err %v", rep, err)
	}
	if _, err := parseStreamReport("error: dial tcp: refused\n"); err == nil {
		t.Error("a stream that printed no report parsed")
	}
}
