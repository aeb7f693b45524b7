package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/cablemesh/cablemesh/tests/vm/guest"
)

// QEMU is the emulator the harness runs (Debian: qemu-system-x86).
const QEMU = "qemu-system-x86_64"

// Accelerators.
const (
	AccelKVM = "kvm"
	AccelTCG = "tcg"
	// AccelEnv forces one ("kvm" or "tcg") instead of probing.
	AccelEnv = "CABLEMESH_VM_ACCEL"
)

// kvmProbeTimeout bounds the KVM probe boot. A working KVM reaches the kernel's panic for want
// of a root in well under a second; a broken nested KVM either fails at once (qemu asserts
// setting an MSR) or hangs in the kernel's early boot.
const kvmProbeTimeout = 15 * time.Second

// ChooseAccel returns the accelerator to boot with and why: AccelEnv when set, else KVM when
// /dev/kvm opens and a probe boot of kernel reaches the kernel's own end, else TCG.
func ChooseAccel(ctx context.Context, kernel Kernel) (string, string) {
	switch v := os.Getenv(AccelEnv); v {
	case AccelKVM, AccelTCG:
		return v, AccelEnv + "=" + v
	case "":
	default:
		return AccelTCG, fmt.Sprintf("%s=%q is neither kvm nor tcg; using tcg", AccelEnv, v)
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return AccelTCG, fmt.Sprintf("no usable /dev/kvm (%v)", err)
	}
	f.Close()
	ctx, cancel := context.WithTimeout(ctx, kvmProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, QEMU, "-accel", "kvm", "-cpu", "host", "-m", "128", "-nographic", "-no-reboot",
		"-nic", "none", "-monitor", "none", "-serial", "stdio", "-kernel", kernel.Image,
		"-append", "console=ttyS0 panic=-1 loglevel=7")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out, err := cmd.CombinedOutput()
	text := string(out)
	if strings.Contains(text, "Kernel panic") || strings.Contains(text, "Unable to mount root") {
		return AccelKVM, "KVM probe boot reached the kernel's end"
	}
	last := lastLines(text, 2)
	if ctx.Err() != nil {
		return AccelTCG, fmt.Sprintf("KVM probe boot hung for %s (nested KVM): %s", kvmProbeTimeout, last)
	}
	return AccelTCG, fmt.Sprintf("KVM probe boot failed (%v): %s", err, last)
}

// Machine is one boot of the guest.
type Machine struct {
	Kernel    Kernel
	Initramfs string
	Share     string // the run's directory, shared read-write
	Accel     string
	MemMiB    int
	CPUs      int
	// Deadline bounds the whole boot, run and power-off; StallTimeout bounds a stretch without
	// any new output on the console or in a command log. Either kills qemu.
	Deadline     time.Duration
	StallTimeout time.Duration
	// Progress gets every new line of the console ("console") and of the command logs (the
	// command's name) as it appears.
	Progress func(source, line string)
}

// ConsoleLog is where the serial console (and qemu's own messages) go, under the share.
const ConsoleLog = "console.log"

// Args is the qemu command line.
func (m Machine) Args() []string {
	args := []string{"-name", "cablemesh-vm", "-m", fmt.Sprint(m.MemMiB), "-smp", fmt.Sprint(m.CPUs),
		"-nographic", "-no-reboot", "-monitor", "none", "-serial", "stdio", "-nic", "none",
		"-kernel", m.Kernel.Image, "-initrd", m.Initramfs,
		"-append", "console=ttyS0 panic=-1 loglevel=4 rdinit=/init",
		"-virtfs", "local,path=/,mount_tag=" + guest.RootTag + ",security_model=none,readonly=on,multidevs=remap",
		"-virtfs", "local,path=" + m.Share + ",mount_tag=" + guest.ShareTag + ",security_model=none,multidevs=remap",
	}
	if m.Accel == AccelKVM {
		return append(args, "-accel", "kvm", "-cpu", "host")
	}
	// Multi-threaded TCG: one host thread per virtual CPU.
	return append(args, "-accel", "tcg,thread=multi", "-cpu", "max")
}

// Run boots the machine and waits until it powers off, ctx ends, the deadline passes or the
// guest stalls; qemu is killed in every case but the first. The error says which.
func (m Machine) Run(ctx context.Context) (time.Duration, error) {
	console, err := os.Create(filepath.Join(m.Share, ConsoleLog))
	if err != nil {
		return 0, err
	}
	defer console.Close()
	cmd := exec.Command(QEMU, m.Args()...)
	cmd.Stdout, cmd.Stderr = console, console
	// Its own process group, killed with the test process should that die.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s: %w", QEMU, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	kill := func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}

	tails := newTailer(m.Share)
	lastGrowth := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			tails.poll(m.Progress)
			if err != nil {
				return time.Since(start), fmt.Errorf("%s exited: %w", QEMU, err)
			}
			return time.Since(start), nil
		case <-ctx.Done():
			kill()
			tails.poll(m.Progress)
			return time.Since(start), fmt.Errorf("stopped: %w", ctx.Err())
		case <-tick.C:
			if tails.poll(m.Progress) {
				lastGrowth = time.Now()
			}
			if d := time.Since(start); d > m.Deadline {
				kill()
				tails.poll(m.Progress)
				return d, fmt.Errorf("the guest was still running after its deadline of %s: killed qemu", m.Deadline)
			}
			if s := time.Since(lastGrowth); s > m.StallTimeout {
				kill()
				tails.poll(m.Progress)
				return time.Since(start), fmt.Errorf("the guest hung: no output on its console or in any command log for %s: killed qemu", s.Round(time.Second))
			}
		}
	}
}

// tailer follows the console log and the command logs of a share, line by line.
type tailer struct {
	share   string
	offsets map[string]int64
	partial map[string]string
}

func newTailer(share string) *tailer {
	return &tailer{share: share, offsets: map[string]int64{}, partial: map[string]string{}}
}

// poll passes every new complete line to progress and reports whether anything grew.
func (t *tailer) poll(progress func(source, line string)) bool {
	files := []string{filepath.Join(t.share, ConsoleLog)}
	logs, _ := filepath.Glob(filepath.Join(t.share, guest.OutDir, "*.log"))
	sort.Strings(logs)
	files = append(files, logs...)
	grew := false
	for _, p := range files {
		b, err := readFrom(p, t.offsets[p])
		if err != nil || len(b) == 0 {
			continue
		}
		grew = true
		t.offsets[p] += int64(len(b))
		source := strings.TrimSuffix(filepath.Base(p), ".log")
		text := t.partial[p] + string(b)
		lines := strings.Split(text, "\n")
		t.partial[p] = lines[len(lines)-1]
		if progress == nil {
			continue
		}
		for _, l := range lines[:len(lines)-1] {
			progress(source, strings.TrimRight(l, "\r"))
		}
	}
	return grew
}

func readFrom(path string, off int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil, err
	}
	return io.ReadAll(io.LimitReader(f, 4<<20))
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Tail is the last n lines of a file ("" when unreadable).
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	b = bytes.TrimRight(b, "\n")
	lines := strings.Split(string(b), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

var errNoQEMU = errors.New(QEMU + " is not installed (Debian: qemu-system-x86; scripts/install-deps.sh installs it)")
