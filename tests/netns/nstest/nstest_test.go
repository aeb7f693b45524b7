package nstest

import (
	"os"
	"os/exec"
	"strconv"
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
