package ipsec

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/internal/syncbuf"
)

func appendTo(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// TestFollowPassesCharonsLinesOnAcrossARestart: the follower of an adopted charon starts at the
// log's end (what was logged while no agent ran stays in the file only), passes every complete
// line on in order, reads the old log to its end when a restart puts a new one in place, and
// picks up the new one from its start.
func TestFollowPassesCharonsLinesOnAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	var out syncbuf.Buffer
	p := &charonProcess{charonPaths: charonPaths{logFile: filepath.Join(dir, logFile)}, log: slog.New(slog.NewTextHandler(&out, nil))}
	appendTo(t, p.logFile, "logged while no agent ran\n")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.follow(ctx, true)
	}()
	time.Sleep(2 * followEvery)
	appendTo(t, p.logFile, "one\ntw")
	time.Sleep(2 * followEvery)
	appendTo(t, p.logFile, "o\nlast line of the old charon\n")
	if err := rotateLog(p.logFile); err != nil {
		t.Fatal(err)
	}
	appendTo(t, p.logFile, "first line of the new charon\n")
	waitFor(t, "the new charon's line", func() bool { return strings.Contains(out.String(), "first line of the new charon") })
	appendTo(t, p.logFile, "after\n")
	waitFor(t, "the line after", func() bool { return strings.Contains(out.String(), "line=after") })
	cancel()
	<-done

	var got []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		_, line, _ := strings.Cut(l, "line=")
		got = append(got, strings.Trim(line, `"`))
	}
	want := []string{"one", "two", "last line of the old charon", "first line of the new charon", "after"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("lines passed on %q, want %q", got, want)
	}
	if kept, err := os.ReadFile(filepath.Join(dir, logKeep)); err != nil || !strings.Contains(string(kept), "last line of the old charon") {
		t.Errorf("the old charon's log is not kept as %s: %v %q", logKeep, err, kept)
	}
}

// TestFollowMovesABigLogAside: past maxLogSize the log goes to charon.log.1 and charon.log starts
// empty (charon appends to it, so it carries on at its start); no line is lost on the way.
func TestFollowMovesABigLogAside(t *testing.T) {
	dir := t.TempDir()
	var out syncbuf.Buffer
	p := &charonProcess{charonPaths: charonPaths{logFile: filepath.Join(dir, logFile)}, log: slog.New(slog.NewTextHandler(&out, nil))}
	if err := rotateLog(p.logFile); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.follow(ctx, false)
	}()
	line := strings.Repeat("x", 1023) + "\n"
	appendTo(t, p.logFile, strings.Repeat(line, maxLogSize/len(line)+1))
	waitFor(t, "the log moved aside", func() bool {
		fi, err := os.Stat(p.logFile)
		return err == nil && fi.Size() == 0
	})
	appendTo(t, p.logFile, "after the move\n")
	waitFor(t, "the line after the move", func() bool { return strings.Contains(out.String(), "after the move") })
	cancel()
	<-done
	if n := strings.Count(out.String(), "xxxx\n"); n != maxLogSize/len(line)+1 {
		t.Errorf("%d long lines passed on, want %d", n, maxLogSize/len(line)+1)
	}
	if fi, err := os.Stat(filepath.Join(dir, logKeep)); err != nil || fi.Size() < maxLogSize {
		t.Errorf("%s: %v, want the big log", logKeep, err)
	}
}
