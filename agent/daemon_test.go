package agent

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestProcStateOf(t *testing.T) {
	for _, tc := range []struct{ stat, want string }{
		{"1234 (charon) S 1 1234 1234 0 -1", "running"},
		{"1234 (charon) R 1 1234", "running"},
		{"1234 (charon) T 1 1234", "stopped"},
		{"1234 (char) on) t 1 1234", "stopped"},
		{"1234 (charon) Z 1 1234", "not running"},
		{"garbage", "not running"},
		{"1 (x)", "not running"},
	} {
		if got := procStateOf([]byte(tc.stat)); got != tc.want {
			t.Errorf("procStateOf(%q) = %q, want %q", tc.stat, got, tc.want)
		}
	}
}

// fakeVici serves one connection on a unix socket with answer (nil: reads and never answers).
func fakeVici(t *testing.T, answer []byte) string {
	t.Helper()
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
		if _, err := io.ReadFull(c, body); err != nil || string(body[2:]) != "version" {
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
	t.Run("a charon that answers is running", func(t *testing.T) {
		sock := fakeVici(t, []byte{0, 0, 0, 1, 1})
		d := charonStatus(ctx, os.Getpid(), sock)
		if !d.Answering || d.State != "running" || d.Error != "" {
			t.Errorf("status %+v, want running and answering", d)
		}
	})
	t.Run("a charon that never answers is reported with the timeout", func(t *testing.T) {
		sock := fakeVici(t, nil)
		start := time.Now()
		d := charonStatus(ctx, 0, sock)
		if d.Answering || !strings.Contains(d.Error, "no answer to version") || d.State != "not running" {
			t.Errorf("status %+v, want not answering", d)
		}
		if took := time.Since(start); took > 2*daemonAnswerTimeout {
			t.Errorf("took %v, want about %v", took, daemonAnswerTimeout)
		}
	})
	t.Run("an unknown command answer is not an answer", func(t *testing.T) {
		sock := fakeVici(t, []byte{0, 0, 0, 1, 2})
		if d := charonStatus(ctx, 0, sock); d.Answering || !strings.Contains(d.Error, "packet type 2") {
			t.Errorf("status %+v, want the packet type named", d)
		}
	})
	t.Run("no socket", func(t *testing.T) {
		d := charonStatus(ctx, 0, filepath.Join(t.TempDir(), "none.vici"))
		if d.Answering || !strings.Contains(d.Error, "none.vici") {
			t.Errorf("status %+v, want the socket named", d)
		}
	})
}

// FuzzProcStateOf: /proc/PID/stat holds a command name anyone can choose; reading it never
// panics and always gives one of the three states.
func FuzzProcStateOf(f *testing.F) {
	f.Add([]byte("1234 (charon) S 1 1234"))
	f.Add([]byte("1 ()) T"))
	f.Add([]byte(")"))
	f.Fuzz(func(t *testing.T, stat []byte) {
		switch s := procStateOf(stat); s {
		case "running", "stopped", "not running":
		default:
			t.Errorf("procStateOf(%q) = %q", stat, s)
		}
	})
}
