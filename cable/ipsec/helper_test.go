package ipsec

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/cable"
)

func TestProcStateOf(t *testing.T) {
	for _, tc := range []struct {
		stat string
		want cable.HelperState
	}{
		{"1234 (charon) S 1 1234 1234 0 -1", cable.HelperRunning},
		{"1234 (charon) R 1 1234", cable.HelperRunning},
		{"1234 (charon) T 1 1234", cable.HelperStopped},
		{"1234 (char) on) t 1 1234", cable.HelperStopped},
		{"1234 (charon) Z 1 1234", cable.HelperNotRunning},
		{"garbage", cable.HelperNotRunning},
		{"1 (x)", cable.HelperNotRunning},
	} {
		if got := procStateOf([]byte(tc.stat)); got != tc.want {
			t.Errorf("procStateOf(%q) = %q, want %q", tc.stat, got, tc.want)
		}
	}
}

// fakeVici serves one connection on a unix socket: it reads a vici "version" request and
// writes answer (nil: it never answers, as a stopped charon whose socket still accepts).
func fakeVici(t *testing.T, answer []byte) string {
	t.Helper()
	// Not t.TempDir: a unix socket path must fit in 108 bytes.
	dir, err := os.MkdirTemp("", "vici")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "charon.vici")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var hdr [4]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
		if _, err := io.ReadFull(c, body); err != nil || len(body) < 2 || string(body[2:2+int(body[1])]) != "version" {
			return
		}
		if answer == nil {
			time.Sleep(3 * time.Second)
			return
		}
		_, _ = c.Write(answer)
	}()
	return path
}

func TestCharonStatus(t *testing.T) {
	ctx := context.Background()
	status := func(pid int, sock string) cable.HelperStatus {
		return charonStatus(ctx, pid, sock, socketClient{path: sock})
	}
	t.Run("a charon that answers is running", func(t *testing.T) {
		sock := fakeVici(t, []byte{0, 0, 0, 1, 1})
		d := status(os.Getpid(), sock)
		if !d.Answering || d.State != cable.HelperRunning || d.Error != "" || d.Name != "charon" || d.Control != sock {
			t.Errorf("status %+v, want running and answering", d)
		}
	})
	t.Run("a system charon that answers is running", func(t *testing.T) {
		sock := fakeVici(t, []byte{0, 0, 0, 1, 1})
		if d := status(0, sock); !d.Answering || d.State != cable.HelperRunning {
			t.Errorf("status %+v, want running and answering", d)
		}
	})
	t.Run("a charon that never answers is reported with the timeout", func(t *testing.T) {
		sock := fakeVici(t, nil)
		start := time.Now()
		d := status(0, sock)
		t.Logf("%+v", d)
		if d.Answering || !strings.Contains(d.Error, "no answer to version within 1s") || d.State != cable.HelperNotRunning {
			t.Errorf("status %+v, want not answering, with the timeout", d)
		}
		if took := time.Since(start); took > 2*cable.HelperAnswerTimeout {
			t.Errorf("took %v, want about %v", took, cable.HelperAnswerTimeout)
		}
	})
	t.Run("an unknown command answer is not an answer", func(t *testing.T) {
		sock := fakeVici(t, []byte{0, 0, 0, 1, 2})
		d := status(0, sock)
		t.Logf("%+v", d)
		if d.Answering || !strings.Contains(d.Error, "response type") {
			t.Errorf("status %+v, want not answering, with the reason", d)
		}
	})
	t.Run("no socket", func(t *testing.T) {
		d := status(0, filepath.Join(t.TempDir(), "none.vici"))
		if d.Answering || !strings.Contains(d.Error, "none.vici") {
			t.Errorf("status %+v, want the socket named", d)
		}
	})
}

// TestHelpersDoNotWaitForTheDriverLock: a Connect holds d.mu while it waits on charon (up to
// defaultCallTimeout when charon is stopped); Helpers must answer meanwhile.
func TestHelpersDoNotWaitForTheDriverLock(t *testing.T) {
	d, err := NewDriver(cable.LocalNode{Cluster: "east", Node: "gw1", StateDir: t.TempDir()}, cable.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	sock := fakeVici(t, []byte{0, 0, 0, 1, 1})
	d.cfg.SystemVICI = sock
	d.mu.Lock()
	defer d.mu.Unlock()
	done := make(chan []cable.HelperStatus, 1)
	go func() { done <- d.Helpers(context.Background()) }()
	select {
	case hs := <-done:
		if len(hs) != 1 || !hs[0].Answering || hs[0].Control != sock || hs[0].PID != 0 {
			t.Errorf("helpers %+v, want the system charon, answering", hs)
		}
	case <-time.After(2 * cable.HelperAnswerTimeout):
		t.Fatal("Helpers waited for the driver's lock")
	}
	if pid := d.CharonPID(); pid != 0 {
		t.Errorf("CharonPID %d with a system charon, want 0", pid)
	}
}

// FuzzProcStateOf: /proc/PID/stat holds a command name anyone can choose; reading it never
// panics and always gives one of the three states.
func FuzzProcStateOf(f *testing.F) {
	f.Add([]byte("1234 (charon) S 1 1234"))
	f.Add([]byte("1 ()) T"))
	f.Add([]byte(")"))
	f.Fuzz(func(t *testing.T, stat []byte) {
		switch s := procStateOf(stat); s {
		case cable.HelperRunning, cable.HelperStopped, cable.HelperNotRunning:
		default:
			t.Errorf("procStateOf(%q) = %q", stat, s)
		}
	})
}

// TestConnectionsGiveUpWhenTheDriverIsBusy: the status reads the connections under a short
// deadline; a call to a stopped charon holding d.mu must not hold the status up with it.
func TestConnectionsGiveUpWhenTheDriverIsBusy(t *testing.T) {
	d, err := NewDriver(cable.LocalNode{Cluster: "east", Node: "gw1", StateDir: t.TempDir()}, cable.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = d.Connections(ctx)
	took := time.Since(start)
	d.mu.Unlock()
	if err == nil || !strings.Contains(err.Error(), "busy with a charon request") || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Connections while the driver is busy = %v, want the busy error", err)
	}
	if took > 2*time.Second {
		t.Errorf("took %v, want about the 50ms deadline", took)
	}
	// Once the lock is free, Connections goes on (here: not initialised).
	if _, err := d.Connections(context.Background()); !errors.Is(err, cable.ErrNotInitialised) {
		t.Errorf("Connections after = %v, want not initialised", err)
	}
}

// TestAVICITimeoutIsADeadlineError: the socket's deadline is the context's and may fire first,
// before ctx.Err() is set; charonStatus then recognises the timeout by the error, which must
// wrap os.ErrDeadlineExceeded through govici and socketClient.
func TestAVICITimeoutIsADeadlineError(t *testing.T) {
	sock := fakeVici(t, nil)
	c := socketClient{path: sock}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.call(ctx, "version", nil)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a vici call past its deadline = %v, want an error wrapping os.ErrDeadlineExceeded", err)
	}
}
