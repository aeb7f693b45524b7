package nstest

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestNameCarriesThePrefixAndThisProcessID(t *testing.T) {
	if got, want := Prefix("cbtx").Name("a"), "cbtx"+strconv.Itoa(os.Getpid())+"-a"; got != want {
		t.Errorf("Name: %q, want %q", got, want)
	}
}

func TestAliveTellsARunningProcessFromAZombieAndAnEndedOne(t *testing.T) {
	if !Alive(os.Getpid()) {
		t.Error("this process is not alive")
	}
	cmd := exec.Command("sleep", "0")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start sleep: %v", err)
	}
	pid := cmd.Process.Pid
	// Not waited for: once it has exited it stays a zombie, which signal 0 still reaches.
	deadline := time.Now().Add(5 * time.Second)
	for Alive(pid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if Alive(pid) {
		t.Errorf("process %d that exited (a zombie) counts as alive", pid)
	}
	cmd.Wait()
	if Alive(pid) {
		t.Errorf("reaped process %d counts as alive", pid)
	}
}

func TestAddRefusesAHarnessRunPrefix(t *testing.T) {
	for _, p := range []string{"cbt7", "cbta", "cbt7a3f-"} {
		if !harnessRunPrefix.MatchString(p) {
			t.Errorf("prefix %q has the shape of a harness run prefix, but passes", p)
		}
	}
	for _, p := range []string{"cbtv", "cbti", "cbtl", "cbtx"} {
		if harnessRunPrefix.MatchString(p) {
			t.Errorf("prefix %q is refused, but a harness run prefix cannot start so", p)
		}
	}
}

// TestSweepDeadRemovesOnlyTheNamespacesOfEndedRuns: of two namespaces of this scheme, the one
// whose owner has ended goes, the one whose owner runs (this process) stays, and a namespace of
// another scheme is not looked at.
func TestSweepDeadRemovesOnlyTheNamespacesOfEndedRuns(t *testing.T) {
	RequireRoot(t, "creates network namespaces", "ip")
	cmd := exec.Command("sleep", "0")
	if err := cmd.Run(); err != nil {
		t.Skipf("cannot run sleep: %v", err)
	}
	ended := cmd.Process.Pid // exited and reaped
	p := Prefix("cbtz")
	dead, live := "cbtz"+strconv.Itoa(ended)+"-x", p.Name("x")
	for _, ns := range []string{dead, live} {
		t.Cleanup(func() { _ = Delete(ns) })
		if err := Create(ns); err != nil {
			t.Fatal(err)
		}
	}
	owner := func(ns string) (int, bool) {
		var pid int
		if _, err := fmt.Sscanf(strings.TrimPrefix(ns, "cbtz"), "%d-", &pid); err != nil || !strings.HasPrefix(ns, "cbtz") {
			return 0, false
		}
		return pid, true
	}
	removed, err := SweepDead(owner)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{dead}) {
		t.Errorf("SweepDead removed %v, want only %s", removed, dead)
	}
	names, err := List()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(names, live) || slices.Contains(names, dead) {
		t.Errorf("after the sweep the namespaces are %v: want %s kept and %s gone", names, live, dead)
	}
}
