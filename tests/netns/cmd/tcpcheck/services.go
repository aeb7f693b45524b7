package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"
	"syscall"
	"time"
)

// The services modes, for the tests of service VIPs:
//
//	tcpcheck hello   -listen ADDR -reply TEXT    TCP server: greets every connection with TEXT and a
//	                                             newline, then echoes
//	tcpcheck udpecho -listen ADDR -reply TEXT    UDP server: answers every datagram with TEXT
//	                                             (both: "{peer}" in TEXT becomes the caller's IP
//	                                             as the server sees it, for the NAT tests)
//	tcpcheck ask     -addr ADDR [-timeout 2s]    one TCP connection: prints the greeting as
//	                                             {"reply","peer","us","at"} (peer is getpeername,
//	                                             us the time to connect and read it)
//	tcpcheck udpask  -addr ADDR [-timeout 2s]    one datagram from an unconnected socket: prints
//	                                             the answer and its source as {"reply","peer",...}
//	tcpcheck asks    -addr ADDR -duration 5s     asks again and again for the duration, one JSON
//	                 [-timeout 200ms]            line per attempt (with "error" when it failed)
//	tcpcheck hold    -addr ADDR                  one TCP connection: prints the greeting, then
//	                                             waits; when the connection fails or ends it
//	                                             prints {"error","errno","at"} and exits 0

// hello is one exchange's report.
type hello struct {
	Reply string `json:"reply,omitempty"`
	Peer  string `json:"peer,omitempty"`
	Micro int64  `json:"us"`
	Error string `json:"error,omitempty"`
	Errno int    `json:"errno,omitempty"`
	At    int64  `json:"at"`
}

func (h hello) print() {
	h.At = time.Now().UnixNano()
	b, _ := json.Marshal(h)
	fmt.Println(string(b))
}

func errno(err error) int {
	var en syscall.Errno
	if errors.As(err, &en) {
		return int(en)
	}
	return 0
}

func serveHello(listen, reply string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", listen, err)
	}
	fmt.Printf("listening %s\n", ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			return fmt.Errorf("accept on %s: %w", listen, err)
		}
		// The connection's goroutine ends when the peer closes; the process is killed to stop.
		go func() {
			defer c.Close()
			if _, err := io.WriteString(c, withPeer(reply, c.RemoteAddr())+"\n"); err != nil {
				return
			}
			_, _ = io.Copy(c, c)
		}()
	}
}

func serveUDPEcho(listen, reply string) error {
	pc, err := net.ListenPacket("udp", listen)
	if err != nil {
		return fmt.Errorf("listen udp %s: %w", listen, err)
	}
	fmt.Printf("listening %s\n", pc.LocalAddr())
	buf := make([]byte, 2048)
	for {
		_, from, err := pc.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("read on %s: %w", listen, err)
		}
		_, _ = pc.WriteTo([]byte(withPeer(reply, from)), from)
	}
}

// withPeer fills the "{peer}" placeholder of a reply with the caller's IP.
func withPeer(reply string, from net.Addr) string {
	if !strings.Contains(reply, "{peer}") {
		return reply
	}
	ip := from.String()
	if h, _, err := net.SplitHostPort(ip); err == nil {
		ip = h
	}
	return strings.ReplaceAll(reply, "{peer}", ip)
}

// askTCP connects and reads the greeting.
func askTCP(addr string, timeout time.Duration) (hello, net.Conn) {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return hello{Error: err.Error(), Errno: errno(err), Micro: time.Since(start).Microseconds()}, nil
	}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	h := hello{Reply: strings.TrimSpace(line), Peer: c.RemoteAddr().String(), Micro: time.Since(start).Microseconds()}
	if err != nil {
		c.Close()
		h.Error, h.Errno = err.Error(), errno(err)
		return h, nil
	}
	_ = c.SetReadDeadline(time.Time{})
	return h, c
}

func askUDP(addr string, timeout time.Duration) hello {
	start := time.Now()
	dst, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return hello{Error: err.Error()}
	}
	pc, err := net.ListenUDP("udp", nil)
	if err != nil {
		return hello{Error: err.Error(), Errno: errno(err)}
	}
	defer pc.Close()
	if _, err := pc.WriteToUDP([]byte("ping"), dst); err != nil {
		return hello{Error: err.Error(), Errno: errno(err), Micro: time.Since(start).Microseconds()}
	}
	_ = pc.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 2048)
	n, from, err := pc.ReadFromUDP(buf)
	if err != nil {
		return hello{Error: err.Error(), Errno: errno(err), Micro: time.Since(start).Microseconds()}
	}
	return hello{Reply: string(buf[:n]), Peer: from.String(), Micro: time.Since(start).Microseconds()}
}

func ask(addr string, timeout time.Duration) error {
	h, c := askTCP(addr, timeout)
	if c != nil {
		c.Close()
	}
	h.print()
	return nil
}

func udpAsk(addr string, timeout time.Duration) error {
	askUDP(addr, timeout).print()
	return nil
}

func asks(addr string, timeout, duration time.Duration) error {
	end := time.Now().Add(duration)
	for time.Now().Before(end) {
		h, c := askTCP(addr, timeout)
		if c != nil {
			c.Close()
		}
		h.print()
		if h.Error != "" {
			time.Sleep(10 * time.Millisecond) // a refusal comes back at once: do not spin
		}
	}
	return nil
}

func hold(addr string, timeout time.Duration) error {
	h, c := askTCP(addr, timeout)
	h.print()
	if c == nil {
		os.Exit(1)
	}
	defer c.Close()
	buf := make([]byte, 512)
	for {
		if _, err := c.Read(buf); err != nil {
			hello{Error: err.Error(), Errno: errno(err)}.print()
			return nil
		}
	}
}

// The benchmark modes:
//
//	tcpcheck connbench -addr ADDR -count N      N connections one after another (each closed at
//	                                            once): prints {"count","errors","p50us","p90us",
//	                                            "p99us","meanus"} of the connect() times
//	tcpcheck rrbench -addr ADDR -duration 3s    one connection to a hello server: sends a line and
//	                                            reads its echo again and again for the duration:
//	                                            prints {"transactions","seconds","perSecond"}

type connStats struct {
	Count  int     `json:"count"`
	Errors int     `json:"errors"`
	P50    float64 `json:"p50us"`
	P90    float64 `json:"p90us"`
	P99    float64 `json:"p99us"`
	Mean   float64 `json:"meanus"`
}

func connBench(addr string, count int, timeout time.Duration) error {
	var us []float64
	st := connStats{Count: count}
	for range count {
		start := time.Now()
		c, err := net.DialTimeout("tcp", addr, timeout)
		d := float64(time.Since(start).Nanoseconds()) / 1e3
		if err != nil {
			st.Errors++
			continue
		}
		_ = c.(*net.TCPConn).SetLinger(0) // no TIME_WAIT pile-up on the client's ports
		c.Close()
		us = append(us, d)
	}
	if len(us) == 0 {
		return fmt.Errorf("no connection to %s succeeded", addr)
	}
	sort.Float64s(us)
	var sum float64
	for _, v := range us {
		sum += v
	}
	st.Mean = sum / float64(len(us))
	st.P50, st.P90, st.P99 = pct(us, 50), pct(us, 90), pct(us, 99)
	b, _ := json.Marshal(st)
	fmt.Println(string(b))
	return nil
}

// pct is the nearest-rank percentile of sorted v.
func pct(v []float64, p float64) float64 {
	i := int(float64(len(v))*p/100+0.999999) - 1
	return v[max(0, min(i, len(v)-1))]
}

func rrBench(addr string, duration, timeout time.Duration) error {
	h, c := askTCP(addr, timeout)
	if c == nil {
		return fmt.Errorf("connect %s: %s", addr, h.Error)
	}
	defer c.Close()
	rd := bufio.NewReader(c)
	msg := []byte("ping\n")
	n := 0
	start := time.Now()
	end := start.Add(duration)
	for time.Now().Before(end) {
		_ = c.SetDeadline(time.Now().Add(timeout))
		if _, err := c.Write(msg); err != nil {
			return err
		}
		if _, err := rd.ReadString('\n'); err != nil {
			return err
		}
		n++
	}
	secs := time.Since(start).Seconds()
	b, _ := json.Marshal(struct {
		Transactions int     `json:"transactions"`
		Seconds      float64 `json:"seconds"`
		PerSecond    float64 `json:"perSecond"`
	}{n, secs, float64(n) / secs})
	fmt.Println(string(b))
	return nil
}
