// Package guest is the contract between the host side of the VM test harness (tests/vm) and the
// program the guest runs as PID 1 (tests/vm/guestinit): the names of the 9p shares, where the
// guest mounts them, the plan the host writes and the results the guest writes back. It does no
// I/O beyond reading and writing those JSON files.
package guest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// The two 9p shares the guest mounts.
const (
	// RootTag is the host's / exported read-only; the guest mounts it as the lower layer of an
	// overlay whose upper layer is a tmpfs, and runs everything from it.
	RootTag = "cmroot"
	// ShareTag is the run's own directory, read-write: the plan, the binaries, the results.
	ShareTag = "cmshare"
	// ShareMount is where the guest mounts ShareTag (in the final root).
	ShareMount = "/mnt/cablemesh-vm"
)

// Files in the share, relative to its root.
const (
	PlanFile  = "plan.json"
	OutDir    = "out"
	GuestFile = "out/guest.json" // Report
	// DoneFile is written last, after every command ran: its absence means the guest died or hung.
	DoneFile = "out/done"
)

// Files in the initramfs.
const (
	InitramfsModules = "/modules"       // boot modules (virtio, 9p, overlay), loaded in ModuleOrder
	ModuleOrder      = "/modules/order" // one file name per line, dependencies first
)

// Plan is what the host asks the guest to do.
type Plan struct {
	// KernelTree is the directory holding lib/modules/<release> of the guest kernel (a path in
	// the host's file system, which the guest sees read-only). The guest bind-mounts it on
	// /lib/modules so that modprobe, and the kernel's own module requests, find the modules.
	KernelTree string `json:"kernelTree"`
	// Modules are loaded with modprobe (dependencies and all) before any command runs. A module
	// that fails to load is reported, not fatal: the tests say what they miss.
	Modules []string `json:"modules"`
	// Commands run one after the other.
	Commands []Command `json:"commands"`
}

// Command is one program the guest runs, with its output in out/<Name>.log and its Outcome in
// out/<Name>.json.
type Command struct {
	Name    string        `json:"name"`
	Dir     string        `json:"dir"`
	Argv    []string      `json:"argv"`
	Env     []string      `json:"env"`
	Timeout time.Duration `json:"timeout"`
}

// Outcome is how one command ended.
type Outcome struct {
	Name     string        `json:"name"`
	ExitCode int           `json:"exitCode"` // -1: it did not exit by itself (timed out, or could not start)
	TimedOut bool          `json:"timedOut"`
	Error    string        `json:"error,omitempty"`
	Took     time.Duration `json:"took"`
}

// Report is what the guest says about itself.
type Report struct {
	KernelRelease string `json:"kernelRelease"`
	KernelVersion string `json:"kernelVersion"`
	// Uptimes (guest clock, since the kernel started) at the stages of boot.
	InitStarted   time.Duration `json:"initStarted"`
	RootMounted   time.Duration `json:"rootMounted"`
	ModulesLoaded time.Duration `json:"modulesLoaded"`
	// LoadedModules is /proc/modules after the plan's modprobes, names only, sorted.
	LoadedModules []string `json:"loadedModules"`
	// ModuleErrors maps a plan module that failed to load to modprobe's message.
	ModuleErrors map[string]string `json:"moduleErrors,omitempty"`
	CPUs         int               `json:"cpus"`
	MemTotalKiB  int               `json:"memTotalKiB"`
}

// LogPath and OutcomePath are where a command's output and outcome go, under the share root.
func LogPath(share, name string) string { return filepath.Join(share, OutDir, name+".log") }

// OutcomePath is out/<name>.json under the share root.
func OutcomePath(share, name string) string { return filepath.Join(share, OutDir, name+".json") }

// WriteJSON writes v as indented JSON to path and syncs it (the guest powers off right after).
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ReadJSON reads path into v.
func ReadJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	return nil
}
