package vm

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/vm/guest"
)

const modulesDep = `kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/fscache/fscache.ko kernel/fs/netfs/netfs.ko
kernel/fs/fscache/fscache.ko: kernel/fs/netfs/netfs.ko
kernel/fs/netfs/netfs.ko:
kernel/net/9p/9pnet.ko:
kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/fs/overlayfs/overlay.ko:
kernel/drivers/net/wireguard/wireguard.ko: kernel/net/ipv4/udp_tunnel.ko kernel/net/ipv6/ip6_udp_tunnel.ko
kernel/net/ipv4/udp_tunnel.ko:
kernel/net/ipv6/ip6_udp_tunnel.ko:
`

func TestModuleLoadOrder(t *testing.T) {
	deps, err := ParseModulesDep(modulesDep)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		modules []string
		want    []string
		wantErr string
	}{
		{"a module without dependencies loads alone", []string{"overlay"}, []string{"kernel/fs/overlayfs/overlay.ko"}, ""},
		{"dependencies load first, each once, whatever order modules.dep lists them in",
			[]string{"9p", "9pnet_virtio"},
			[]string{"kernel/net/9p/9pnet.ko", "kernel/fs/netfs/netfs.ko", "kernel/fs/fscache/fscache.ko", "kernel/fs/9p/9p.ko",
				"kernel/drivers/virtio/virtio_ring.ko", "kernel/drivers/virtio/virtio.ko", "kernel/net/9p/9pnet_virtio.ko"}, ""},
		{"a dash in a name is an underscore, as for modprobe", []string{"9pnet-virtio"},
			[]string{"kernel/net/9p/9pnet.ko", "kernel/drivers/virtio/virtio_ring.ko", "kernel/drivers/virtio/virtio.ko", "kernel/net/9p/9pnet_virtio.ko"}, ""},
		{"a module modules.dep does not know is an error naming it", []string{"esp4"}, nil, "module esp4: not in modules.dep"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := deps.LoadOrder(tc.modules...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("order\n got %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestModulesDepCycleIsAnError(t *testing.T) {
	deps, err := ParseModulesDep("a.ko: b.ko\nb.ko: a.ko\n")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := deps.LoadOrder("a"); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Errorf("err = %v, want a cycle", err)
	}
}

func TestFindKernelTakesTheNewestComplete(t *testing.T) {
	dir := t.TempDir()
	mk := func(rel string, modulesDep bool) {
		t.Helper()
		for _, p := range []string{"boot/vmlinuz-" + rel, "lib/modules/" + rel + "/modules.order"} {
			if err := os.MkdirAll(filepath.Join(dir, rel, filepath.Dir(p)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, rel, p), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if modulesDep {
			if err := os.WriteFile(filepath.Join(dir, rel, "lib/modules", rel, "modules.dep"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	mk("6.1.0-9-amd64", true)
	mk("6.1.0-56-amd64", true)
	mk("6.1.0-101-amd64", false) // depmod never ran: not usable
	k, err := FindKernel(dir)
	if err != nil {
		t.Fatal(err)
	}
	if k.Release != "6.1.0-56-amd64" {
		t.Errorf("release %s, want 6.1.0-56-amd64 (the newest with modules.dep)", k.Release)
	}
	if _, err := FindKernel(t.TempDir()); err == nil || !strings.Contains(err.Error(), "install-kernel.sh") {
		t.Errorf("an empty dir: err = %v, want one naming the install script", err)
	}
}

// readCPIO parses a newc archive: name -> (mode, data, rdev major, rdev minor).
func readCPIO(t *testing.T, b []byte) map[string][4]any {
	t.Helper()
	out := map[string][4]any{}
	off := 0
	field := func(i int) int {
		v, err := strconv.ParseUint(string(b[off+6+8*i:off+6+8*i+8]), 16, 32)
		if err != nil {
			t.Fatalf("header at %d field %d: %v", off, i, err)
		}
		return int(v)
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	for {
		if string(b[off:off+6]) != "070701" {
			t.Fatalf("no newc magic at %d", off)
		}
		mode, size, rmaj, rmin, namesize := field(1), field(6), field(9), field(10), field(11)
		name := string(b[off+110 : off+110+namesize-1])
		dataStart := align(off + 110 + namesize)
		data := b[dataStart : dataStart+size]
		off = align(dataStart + size)
		if name == "TRAILER!!!" {
			if off != len(b) {
				t.Errorf("%d bytes after the trailer", len(b)-off)
			}
			return out
		}
		out[name] = [4]any{mode, string(data), rmaj, rmin}
	}
}

func TestCPIOIsWhatTheKernelUnpacks(t *testing.T) {
	var buf bytes.Buffer
	c := &cpioWriter{w: &buf}
	c.Dir("dev")
	c.CharDev("dev/console", 0o600, 5, 1)
	c.File("init", 0o755, []byte("#!/bin/sh\n"))
	c.File("modules/order", 0o644, []byte("a.ko\nb.ko\n"))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	got := readCPIO(t, buf.Bytes())
	want := map[string][4]any{
		"dev":           {cpioDir | 0o755, "", 0, 0},
		"dev/console":   {cpioChr | 0o600, "", 5, 1},
		"init":          {cpioFile | 0o755, "#!/bin/sh\n", 0, 0},
		"modules/order": {cpioFile | 0o644, "a.ko\nb.ko\n", 0, 0},
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: got %v, want %v", name, got[name], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d entries, want %d: %v", len(got), len(want), got)
	}
}

func TestQEMUCommandLine(t *testing.T) {
	m := Machine{Kernel: Kernel{Image: "/k/vmlinuz"}, Initramfs: "/s/initramfs.cpio", Share: "/s", MemMiB: 3072, CPUs: 2}
	for _, tc := range []struct {
		accel string
		want  []string
	}{
		{AccelTCG, []string{"-accel", "tcg,thread=multi", "-cpu", "max"}},
		{AccelKVM, []string{"-accel", "kvm", "-cpu", "host"}},
	} {
		m.Accel = tc.accel
		args := strings.Join(m.Args(), " ")
		for _, w := range append(tc.want, "-nographic", "-no-reboot", "-m 3072", "-smp 2", "-kernel /k/vmlinuz", "-initrd /s/initramfs.cpio",
			"local,path=/,mount_tag="+guest.RootTag+",security_model=none,readonly=on",
			"local,path=/s,mount_tag="+guest.ShareTag+",") {
			if !strings.Contains(args, w) {
				t.Errorf("%s: command line lacks %q: %s", tc.accel, w, args)
			}
		}
	}
}

func TestSummaryOfGoTestOutput(t *testing.T) {
	s := summarize(`=== RUN   TestA
--- PASS: TestA (1.50s)
=== RUN   TestB
    --- PASS: TestB/sub (0.10s)
--- SKIP: TestB (0.00s)
    x_test.go:1: skipping: no wireguard
--- FAIL: TestC (12.00s)
FAIL
`)
	if s.ran != 3 || !slices.Equal(s.passed, []string{"TestA"}) || !slices.Equal(s.skipped, []string{"TestB"}) || !slices.Equal(s.failed, []string{"TestC"}) {
		t.Errorf("summary %+v", s)
	}
	if s.skipReasons["TestB"] != "x_test.go:1: skipping: no wireguard" {
		t.Errorf("skip reason %q", s.skipReasons["TestB"])
	}
}

func TestTailerHandsOverWholeLines(t *testing.T) {
	share := t.TempDir()
	if err := os.MkdirAll(filepath.Join(share, guest.OutDir), 0o755); err != nil {
		t.Fatal(err)
	}
	console := filepath.Join(share, ConsoleLog)
	tl := newTailer(share)
	var got []string
	progress := func(src, line string) { got = append(got, src+": "+line) }
	if tl.poll(progress) {
		t.Errorf("nothing written yet, but poll saw growth")
	}
	if err := os.WriteFile(console, []byte("boot 1\nboot 2\npart"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(guest.LogPath(share, "netns"), []byte("=== RUN TestX\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !tl.poll(progress) {
		t.Errorf("poll saw no growth")
	}
	f, err := os.OpenFile(console, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("ial\n")
	f.Close()
	tl.poll(progress)
	want := []string{"console: boot 1", "console: boot 2", "netns: === RUN TestX", "console: partial"}
	if !slices.Equal(got, want) {
		t.Errorf("lines\n got %q\nwant %q", got, want)
	}
}

func TestOutcomeRoundTrip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "o.json")
	in := guest.Outcome{Name: "netns", ExitCode: 1, Took: 3 * time.Second}
	if err := guest.WriteJSON(p, in); err != nil {
		t.Fatal(err)
	}
	var out guest.Outcome
	if err := guest.ReadJSON(p, &out); err != nil || out != in {
		t.Errorf("read back %+v, %v; want %+v", out, err, in)
	}
}
