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
	if !alive(os.Getpid()) {
		t.Error("this process is not alive")
	}
	cmd := exec.Command("sleep", "0")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start sleep: %v", err)
	}
	pid := cmd.Process.Pid
	// Not waited for: once it has exited it stays a zombie, which signal 0 still reaches.
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(pid) {
		t.Errorf("process %d that exited (a zombie) counts as alive", pid)
	}
	cmd.Wait()
	if alive(pid) {
		t.Errorf("reaped process %d counts as alive", pid)
	}
}
