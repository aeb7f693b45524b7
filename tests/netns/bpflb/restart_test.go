package bpflb

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/cablemesh/cablemesh/bpf"
)

func attachments(t *testing.T, lb *bpf.LB) []bpf.Attachment {
	t.Helper()
	a, err := lb.Attachments()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestAnAgentRestartAdoptsThePinsAndKeepsConnectionsAndTranslation(t *testing.T) {
	e := newEnv(t, bpf.DestroyAuto)
	bs := startBackends(t, e, backendA4, backendB4)
	services := []bpf.Service{service(vip4, bpf.TCP, backendA4, backendB4)}
	e.sync(services...)
	vip := ap(vip4, 80)
	held := startClient(t, e, "hold-tcp", vip)
	held.must("connected", 10*time.Second)
	before := attachments(t, e.lb)

	if err := e.lb.Close(); err != nil {
		t.Fatal(err)
	}
	// Between the agents the hooks stay attached and keep translating.
	spreadOver(t, runOK(t, e, "tcp", vip, "50").Replies, nameA4, nameB4)

	e.lb = e.open()
	if after := attachments(t, e.lb); !slices.Equal(after, before) {
		t.Errorf("attachments after the restart:\n  %v\nwant the same links and programs as before:\n  %v", after, before)
	}
	got, err := e.lb.Services()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[0].Backends) != 2 {
		t.Errorf("services after the restart: %v, want the synced one", got)
	}
	e.sync(services...)
	if w := e.lb.Writes(); w != 0 {
		t.Errorf("the first Sync after the restart, with the same services, made %d writes", w)
	}
	bs.push(t, "after-restart")
	if r := held.must("data", 5*time.Second); r.Reply != "after-restart" {
		t.Errorf("the connection opened before the restart got %+v", r)
	}
	spreadOver(t, runOK(t, e, "tcp", vip, "100").Replies, nameA4, nameB4)
}

func TestOpenReplacesAnOutdatedProgramInAPinnedLinkWithoutDetaching(t *testing.T) {
	e := newEnv(t, bpf.DestroyAuto)
	startBackends(t, e, backendA4)
	if err := e.lb.Remove(); err != nil {
		t.Fatal(err)
	}
	// An "older agent's" connect4: lets every connect through untranslated.
	old, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.CGroupSockAddr, AttachType: ebpf.AttachCGroupInet4Connect, License: "GPL",
		Instructions: asm.Instructions{asm.LoadImm(asm.R0, 1, asm.DWord), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	l, err := link.AttachCgroup(link.CgroupOptions{Path: e.cgroup, Attach: ebpf.AttachCGroupInet4Connect, Program: old})
	if err != nil {
		t.Fatal(err)
	}
	pin := filepath.Join(e.pinDir, "links", "lb_connect4")
	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := l.Pin(pin); err != nil {
		t.Fatal(err)
	}
	oldInfo, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	l.Close()

	e.lb = e.open()
	var connect4 bpf.Attachment
	for _, a := range attachments(t, e.lb) {
		if a.Hook == "connect4" {
			connect4 = a
		}
	}
	if connect4.LinkID != uint32(oldInfo.ID) {
		t.Errorf("connect4 runs in link %d, want the pinned link %d kept", connect4.LinkID, oldInfo.ID)
	}
	if connect4.ProgramID == uint32(oldInfo.Program) {
		t.Errorf("connect4 still runs the old program %d", oldInfo.Program)
	}
	e.sync(service(vip4, bpf.TCP, backendA4))
	if r := runOK(t, e, "tcp", ap(vip4, 80), "3"); r.Replies[nameA4] != 3 {
		t.Errorf("connects after the program update reached %v, want backend A", r.Replies)
	}
}

func TestRemoveLeavesNoPinAndNoAttachedProgram(t *testing.T) {
	e := newEnv(t, bpf.DestroyAuto)
	startBackends(t, e, backendA4)
	e.sync(service(vip4, bpf.TCP, backendA4))
	before := attachments(t, e.lb)
	if err := e.lb.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(e.pinDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("PinDir %s after Remove: %v, want it gone", e.pinDir, err)
	}
	for _, a := range before {
		if l, err := linkFromID(a.LinkID); err == nil {
			l.Close()
			t.Errorf("link %d of %s still exists after Remove", a.LinkID, a.Hook)
		}
	}
	cg, err := os.Open(e.cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	for _, at := range []ebpf.AttachType{
		ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupUDP4Sendmsg, ebpf.AttachCGroupUDP4Recvmsg, ebpf.AttachCgroupInet4GetPeername,
		ebpf.AttachCGroupInet6Connect, ebpf.AttachCGroupUDP6Sendmsg, ebpf.AttachCGroupUDP6Recvmsg, ebpf.AttachCgroupInet6GetPeername,
	} {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(cg.Fd()), Attach: at})
		if err != nil {
			t.Fatalf("query %s: %v", at, err)
		}
		if len(res.Programs) != 0 {
			t.Errorf("%s: %d programs still attached to the cgroup after Remove", at, len(res.Programs))
		}
	}
	// The VIP is no longer translated: it has no route in the client namespace.
	if r := run(t, e, "connect-error", ap(vip4, 80)); syscall.Errno(r.Errno) != syscall.ENETUNREACH {
		t.Errorf("connect to the VIP after Remove: %q, want ENETUNREACH (untranslated)", r.Error)
	}
}

func linkFromID(id uint32) (link.Link, error) { return link.NewFromID(link.ID(id)) }

func TestOpenMovesPinnedLinksOntoNewMapsWhenTheMapPinsWereLost(t *testing.T) {
	e := newEnv(t, bpf.DestroyAuto)
	startBackends(t, e, backendA4, backendB4)
	e.sync(service(vip4, bpf.TCP, backendA4))
	before := attachments(t, e.lb)
	if err := e.lb.Close(); err != nil {
		t.Fatal(err)
	}
	maps, _ := filepath.Glob(filepath.Join(e.pinDir, "cm_lb_*"))
	if len(maps) == 0 {
		t.Fatal("no map pins to remove")
	}
	for _, m := range maps {
		if err := os.Remove(m); err != nil {
			t.Fatal(err)
		}
	}

	e.lb = e.open()
	after := attachments(t, e.lb)
	for i := range before {
		if after[i].LinkID != before[i].LinkID || after[i].ProgramID == before[i].ProgramID {
			t.Errorf("%s: link %d program %d, want link %d kept with a program on the new maps (not %d)",
				before[i].Hook, after[i].LinkID, after[i].ProgramID, before[i].LinkID, before[i].ProgramID)
		}
	}
	e.sync(service(vip4, bpf.TCP, backendB4))
	if r := runOK(t, e, "tcp", ap(vip4, 80), "5"); r.Replies[nameB4] != 5 {
		t.Errorf("connects after new maps were synced reached %v, want B", r.Replies)
	}
}

func TestSyncRefusesBadInputBeforeWritingAnything(t *testing.T) {
	e := newEnv(t, bpf.DestroyAuto)
	good := service(vip4, bpf.TCP, backendA4)
	e.sync(good)
	writes := e.lb.Writes()
	bad := service(vip4, bpf.UDP, backendA4)
	bad.Backends[0].Port = 0
	err := e.lb.Sync([]bpf.Service{service(vip6, bpf.TCP, backendA6), bad})
	if err == nil || !strings.Contains(err.Error(), "service[1] 241.231.0.1:80/udp: backend[0] 10.231.0.2: port 0") {
		t.Errorf("Sync with a backend on port 0: %v, want an error naming the service and the backend", err)
	}
	if w := e.lb.Writes(); w != writes {
		t.Errorf("a refused Sync made %d writes", w-writes)
	}
	got, err := e.lb.Services()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].String() != good.String() {
		t.Errorf("services after a refused Sync: %v, want only %s", got, good)
	}
}
