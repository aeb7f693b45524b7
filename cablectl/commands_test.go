package cablectl

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/internal/syncbuf"
)

func TestCompletionScripts(t *testing.T) {
	for _, tc := range []struct{ shell, marker string }{
		{"bash", "__start_cablectl"},
		{"zsh", "#compdef cablectl"},
		{"fish", "complete -c cablectl"},
	} {
		t.Run(tc.shell, func(t *testing.T) {
			out, err := runCablectl("completion", tc.shell)
			if err != nil || !strings.Contains(out, tc.marker) {
				t.Errorf("completion %s: %v, output lacks %q (%d bytes)", tc.shell, err, tc.marker, len(out))
			}
		})
	}
	// The scripts ask cablectl itself (__complete): it knows the commands and -o's values.
	out, err := runCablectl("__complete", "")
	for _, c := range []string{"diagnose", "links", "status", "version", "cluster"} {
		if err != nil || !strings.Contains(out, c+"\t") {
			t.Errorf("completion of the command lacks %s: %v\n%s", c, err, out)
		}
	}
	out, err = runCablectl("__complete", "links", "-o", "")
	if err != nil || !strings.Contains(out, "table\njson\nyaml\n") {
		t.Errorf("completion of -o: %v\n%s", err, out)
	}
	if _, err := runCablectl("completion", "tcsh"); ExitCode(err) != 2 {
		t.Errorf("completion tcsh: %v (exit %d), want exit 2", err, ExitCode(err))
	}
}

// TestExitCodes runs every command badly: each is bad usage (2); a group's unknown subcommand
// too. Calls that fail for real reasons are 1 (the tests of each command check those).
func TestExitCodes(t *testing.T) {
	none := filepath.Join(t.TempDir(), "none")
	for _, args := range [][]string{
		{"bogus"},
		{"cluster", "bogus"},
		{"service", "bogus"},
		{"connection-policy", "bogus"},
		{"links", "extra"},
		{"links", "--socket", none, "-o", "xml"},
		{"diagnose", "--no-such-flag"},
		{"version", "-o", "wide"},
		{"status", "--watch", "--interval", "1ms", "--socket", none},
		{"status", "-o", "csv", "--socket", none},
		{"cluster", "list", "-o", "csv"},
		{"cert", "list", "-o", "csv"},
	} {
		_, err := runCablectl(args...)
		if got := ExitCode(err); got != 2 {
			t.Errorf("cablectl %s: %v, exit %d, want 2", strings.Join(args, " "), err, got)
		}
	}
	for _, args := range [][]string{
		{"links", "--socket", none},
		{"diagnose", "--socket", none},
		{"status", "--socket", none},
		{"version", "--socket", none},
	} {
		_, err := runCablectl(args...)
		if got := ExitCode(err); got != 1 {
			t.Errorf("cablectl %s: %v, exit %d, want 1", strings.Join(args, " "), err, got)
		}
	}
	if out, err := runCablectl("cluster"); err != nil || !strings.Contains(out, "Available Commands") {
		t.Errorf("cablectl cluster (a group alone): %v, want its help and exit 0\n%s", err, out)
	}
	if ExitCode(errors.New("x")) != 1 || ExitCode(nil) != 0 {
		t.Error("exitCode")
	}
}

// TestEveryCommandThatPrintsDataTakesOutput: every runnable command has -o (the root's
// persistent flag) and no command defines a conflicting one.
func TestEveryCommandThatPrintsDataTakesOutput(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Runnable() && c.Flag("output") == nil {
			t.Errorf("%s has no -o", c.CommandPath())
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(NewRoot())
}

func TestWatchRedrawsOnlyOnChange(t *testing.T) {
	frames := []string{"A\n", "A\n", "A\n", "B\n", "B\n", "!", "C\n"}
	for _, format := range []string{"table", "json"} {
		ctx, cancel := context.WithCancel(context.Background())
		var mu sync.Mutex
		i := 0
		// render plays the frames, then ends the watch as Ctrl-C would.
		render := func(context.Context) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			f := frames[min(i, len(frames)-1)]
			i++
			if i > len(frames) {
				cancel()
			}
			if f == "!" {
				return nil, errors.New("agent gone")
			}
			return []byte(f), nil
		}
		var out syncbuf.Buffer
		done := make(chan error, 1)
		go func() { done <- watchStatus(ctx, &out, format, 5*time.Millisecond, render) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("watch: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("watch did not end when its context did")
		}
		cancel()
		got := out.String()
		if format == "json" {
			if got != "A\nB\nError: agent gone\nC\n" {
				t.Errorf("json watch wrote %q, want each change once", got)
			}
			continue
		}
		if n := strings.Count(got, clearScreen); n != 4 {
			t.Errorf("table watch redrew %d times, want 4 (A, B, the error, C):\n%q", n, got)
		}
		if !strings.Contains(got, "Every 5ms: cablectl status") || !strings.Contains(got, "Error: agent gone") {
			t.Errorf("table watch output %q", got)
		}
	}
}

// A command that prints a line for a person prints data with -o json|yaml.
func TestLineCommandsPrintDataWithOutput(t *testing.T) {
	f := &fakeAgent{exported: map[string]statusapi.Export{"shop/web": {Namespace: "shop", Name: "web"}, "shop/db": {Namespace: "shop", Name: "db"}}}
	sock := f.serve(t)
	out, err := runCablectl("service", "unexport", "web", "-n", "shop", "--socket", sock, "-o", "json")
	var got map[string]any
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || got["namespace"] != "shop" || got["name"] != "web" || got["unexported"] != true {
		t.Errorf("unexport -o json: %v %q", err, out)
	}
	out, err = runCablectl("service", "unexport", "db", "-n", "shop", "--socket", sock, "-o", "yaml")
	if err != nil || !strings.Contains(out, "name: db\n") || !strings.Contains(out, "unexported: true\n") {
		t.Errorf("unexport -o yaml: %v %q", err, out)
	}
	var buf strings.Builder
	if err := printResult(&buf, "table", "cluster east (id 1) removed", map[string]any{"cluster": "east"}); err != nil || buf.String() != "cluster east (id 1) removed\n" {
		t.Errorf("printResult table: %v %q", err, buf.String())
	}
}
