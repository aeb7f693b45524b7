package harness

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// PingDF sends count echo requests of size bytes on the wire (IP header included) with DF set
// (`ping -M do -s size-28`), from namespace ns to addr.
func (m *Mesh) PingDF(ns string, addr netip.Addr, size, count int) PingResult {
	args := []string{"netns", "exec", ns, "ping", "-n", "-q", "-M", "do", "-s", strconv.Itoa(size - 28),
		"-c", strconv.Itoa(count), "-i", "0.2", "-W", "2", addr.String()}
	r := RunTimeout(m.Ctx, time.Duration(count)*time.Second+30*time.Second, "ip", args...)
	res := PingResult{Output: r.Stdout + r.Stderr, Err: r.Err}
	if mm := pingStatsRE.FindStringSubmatch(r.Stdout); mm != nil {
		res.Transmitted, _ = strconv.Atoi(mm[1])
		res.Received, _ = strconv.Atoi(mm[2])
	}
	return res
}

// TCPCheckWithin is TCPCheck with its own connect/echo timeout (a no-connect pair's check
// should fail fast).
func (m *Mesh) TCPCheckWithin(ns string, addr netip.Addr, timeout time.Duration) Result {
	return NSRun(m.Ctx, ns, m.Bin.TCPCheck, "dial", "-addr", netip.AddrPortFrom(addr, TCPServerPort).String(), "-timeout", timeout.String())
}

// Transfer is what `tcpcheck transfer` reports.
type Transfer struct {
	Bytes  int64  `json:"bytes"`
	Ms     int64  `json:"ms"`
	SHA256 string `json:"sha256"`
}

// TCPTransfer sends size bytes from namespace ns through the echo server at addr (a
// StartTCPServer) and back, in full-size segments both ways, and checks they come back intact.
func (m *Mesh) TCPTransfer(ns string, addr netip.Addr, size int64) (Transfer, error) {
	r := RunTimeout(m.Ctx, 2*time.Minute, "ip", "netns", "exec", ns, m.Bin.TCPCheck, "transfer",
		"-addr", netip.AddrPortFrom(addr, TCPServerPort).String(), "-bytes", strconv.FormatInt(size, 10), "-timeout", "5s")
	var t Transfer
	if r.Err != nil {
		return t, fmt.Errorf("%s", r)
	}
	if err := json.Unmarshal([]byte(lastLine(r.Stdout)), &t); err != nil || t.Bytes != size {
		return t, fmt.Errorf("tcpcheck transfer printed %q (%v), want %d bytes", r.Stdout, err, size)
	}
	return t, nil
}

// StreamGap is one pause of a gap stream.
type StreamGap struct {
	AtMs float64 `json:"atMs"`
	Ms   float64 `json:"ms"`
}

// StreamResult is what `tcpcheck stream` prints when it ends.
type StreamResult struct {
	Rounds   int         `json:"rounds"`
	Bytes    int         `json:"bytes"`
	MaxGapMs float64     `json:"maxGapMs"`
	Gaps     []StreamGap `json:"gaps"`
	Error    string      `json:"error,omitempty"`
}

// StartGapStream starts a tcpcheck stream from ns to addr for d that survives stalls up to
// stallLimit and records the longest one. Read the result with ReadStream once it exits.
func (m *Mesh) StartGapStream(name, ns string, addr netip.Addr, d, stallLimit time.Duration) *Process {
	m.T.Helper()
	p, err := StartProcess(name, ns, m.Dir+"/"+name+".log", m.Bin.TCPCheck, "stream",
		"-addr", netip.AddrPortFrom(addr, TCPServerPort).String(), "-duration", d.String(),
		"-timeout", stallLimit.String(), "-gap-report", "100ms")
	m.must(err)
	m.track(p)
	return p
}

// ReadStream waits for a gap stream to end and returns its result.
func ReadStream(p *Process, within time.Duration) (StreamResult, int, error) {
	code, err := p.Wait(within)
	if err != nil {
		return StreamResult{}, -1, err
	}
	var res StreamResult
	for _, l := range strings.Split(p.Log(), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "{") {
			if json.Unmarshal([]byte(l), &res) == nil {
				return res, code, nil
			}
		}
	}
	return res, code, fmt.Errorf("no result line in the log of %s:\n%s", p.Name, p.Log())
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
