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

func TestParseStreamReportReadsTheLastLine(t *testing.T) {
	rep, err := parseStreamReport("connected\n{\"longestStallMs\":1733,\"reconnects\":0,\"received\":5813,\"lost\":2,\"errors\":[\"x\"]}\n")
	if err != nil || rep.LongestStallMs != 1733 || rep.Received != 5813 || rep.Lost != 2 || len(rep.Errors) != 1 {
		t.Errorf("report %+v, err %v", rep, err)
	}
	if _, err := parseStreamReport("error: dial tcp: refused\n"); err == nil {
		t.Error("a stream that printed no report parsed")
	}
}
