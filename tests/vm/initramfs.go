package vm

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/cablemesh/cablemesh/tests/vm/guest"
)

// BootModules are what the guest needs before it has a root: the virtio PCI transport, 9p over
// virtio, and overlayfs. Debian builds them all as modules; the initramfs carries them.
var BootModules = []string{"virtio_pci", "9pnet_virtio", "9p", "overlay"}

// cpioWriter writes a "newc" cpio archive, the format the kernel unpacks an initramfs from.
type cpioWriter struct {
	w   io.Writer
	ino int
	n   int64
	err error
}

// cpio mode bits (see cpio(5)).
const (
	cpioDir  = 0o040000
	cpioFile = 0o100000
	cpioChr  = 0o020000
)

func (c *cpioWriter) write(b []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(b)
	c.n += int64(n)
	c.err = err
}

func (c *cpioWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// entry writes one header, its name and data. rdev is (major, minor) for device nodes.
func (c *cpioWriter) entry(name string, mode uint32, data []byte, rdevMajor, rdevMinor uint32) {
	c.ino++
	nlink := 1
	if mode&cpioDir != 0 {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write(append([]byte(name), 0))
	c.pad()
	c.write(data)
	c.pad()
}

// Dir, File, CharDev and Close add entries; names are relative ("init", "dev/console").
func (c *cpioWriter) Dir(name string) { c.entry(name, cpioDir|0o755, nil, 0, 0) }

func (c *cpioWriter) File(name string, perm uint32, data []byte) {
	c.entry(name, cpioFile|perm, data, 0, 0)
}

func (c *cpioWriter) CharDev(name string, perm, major, minor uint32) {
	c.entry(name, cpioChr|perm, nil, major, minor)
}

// Close writes the trailer.
func (c *cpioWriter) Close() error {
	c.entry("TRAILER!!!", 0, nil, 0, 0)
	return c.err
}

// WriteInitramfs writes the guest's initramfs to path: init (the static guestinit binary), the
// boot modules of k in load order with their order file, and the directories and the console
// node the init needs before it has a root.
func WriteInitramfs(path, initBinary string, k Kernel) error {
	depText, err := os.ReadFile(filepath.Join(k.ModulesDir(), "modules.dep"))
	if err != nil {
		return err
	}
	deps, err := ParseModulesDep(string(depText))
	if err != nil {
		return err
	}
	order, err := deps.LoadOrder(BootModules...)
	if err != nil {
		return fmt.Errorf("boot modules of %s: %w", k.Release, err)
	}
	initBytes, err := os.ReadFile(initBinary)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriter(f)
	c := &cpioWriter{w: bw}
	for _, d := range []string{"dev", "proc", "sys", "lower", "rw", "newroot", "modules"} {
		c.Dir(d)
	}
	c.CharDev("dev/console", 0o600, 5, 1)
	c.CharDev("dev/null", 0o666, 1, 3)
	c.File("init", 0o755, initBytes)
	var names []string
	for _, p := range order {
		b, err := os.ReadFile(filepath.Join(k.ModulesDir(), p))
		if err != nil {
			return err
		}
		name := filepath.Base(p)
		names = append(names, name)
		c.File(strings.TrimPrefix(guest.InitramfsModules, "/")+"/"+name, 0o644, b)
	}
	c.File(strings.TrimPrefix(guest.ModuleOrder, "/"), 0o644, []byte(strings.Join(names, "\n")+"\n"))
	if err := c.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return f.Close()
}
