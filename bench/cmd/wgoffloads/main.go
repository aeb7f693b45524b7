// Command wgoffloads reports, inside one network namespace (run it with `ip netns exec`), the
// offload state of a WireGuard setup, for the WireGuard benchmark (bench/wireguard_test.go):
//
//   - the link's features as `ethtool -k` shows them (read with the ETHTOOL_GFEATURES ioctl):
//     for a wireguard-go TUN, whether the kernel hands it TSO/USO super-packets (virtio-net
//     header and TUNSETOFFLOAD) and takes GRO-coalesced ones back;
//   - for every UDP socket bound to the port, the process holding it and its UDP_GRO option
//     (read on a duplicate of the socket taken with pidfd_getfd). wireguard-go asks for UDP GSO
//     per send (a UDP_SEGMENT control message), so the socket has no state for it: the benchmark
//     measures it instead, as UDP datagrams per segment on the wire.
//
// Usage: wgoffloads -link cbl-wg0 -port 51820. It prints JSON.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Report is what wgoffloads prints.
type Report struct {
	Link     string          `json:"link"`
	Features map[string]bool `json:"features"`
	Sockets  []Socket        `json:"sockets"`
	Errors   []string        `json:"errors,omitempty"`
}

// Socket is one UDP socket bound to the port.
type Socket struct {
	Local   string `json:"local"`
	PID     int    `json:"pid"`
	Process string `json:"process"`
	UDPGRO  *bool  `json:"udpGRO"`
}

// The features the benchmark reports, by their ethtool names.
var wanted = []string{
	"tx-checksum-ip-generic", "tx-scatter-gather", "tx-tcp-segmentation", "tx-tcp6-segmentation",
	"tx-udp-segmentation", "tx-generic-segmentation", "rx-gro", "rx-udp-gro-forwarding", "rx-gro-list",
}

func main() {
	link := flag.String("link", "", "link name")
	port := flag.Int("port", 0, "UDP port")
	flag.Parse()
	r := Report{Link: *link, Features: map[string]bool{}}
	if feats, err := features(*link); err != nil {
		r.Errors = append(r.Errors, fmt.Sprintf("features of %s: %v", *link, err))
	} else {
		for _, w := range wanted {
			if v, ok := feats[w]; ok {
				r.Features[w] = v
			}
		}
	}
	socks, err := udpSockets(*port)
	if err != nil {
		r.Errors = append(r.Errors, fmt.Sprintf("UDP sockets on port %d: %v", *port, err))
	}
	r.Sockets = socks
	_ = json.NewEncoder(os.Stdout).Encode(r)
}

const (
	ethtoolGSSetInfo = 0x37
	ethtoolGStrings  = 0x1b
	ethtoolGFeatures = 0x3a
	ethSSFeatures    = 4
)

type ifreq struct {
	name [unix.IFNAMSIZ]byte
	data uintptr
	_    [16]byte
}

func ethtool(fd int, link string, data unsafe.Pointer) error {
	var ifr ifreq
	copy(ifr.name[:], link)
	ifr.data = uintptr(data)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return e
	}
	return nil
}

// features reads the link's active features by name.
func features(link string) (map[string]bool, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	// struct ethtool_sset_info { u32 cmd; u32 reserved; u64 sset_mask; u32 data[1]; }
	var sset struct {
		cmd, reserved uint32
		mask          uint64
		data          uint32
	}
	sset.cmd, sset.mask = ethtoolGSSetInfo, 1<<ethSSFeatures
	if err := ethtool(fd, link, unsafe.Pointer(&sset)); err != nil {
		return nil, fmt.Errorf("ETHTOOL_GSSET_INFO: %w", err)
	}
	n := int(sset.data)
	// struct ethtool_gstrings { u32 cmd; u32 string_set; u32 len; u8 data[len*32]; }
	sbuf := make([]byte, 12+n*32)
	*(*uint32)(unsafe.Pointer(&sbuf[0])) = ethtoolGStrings
	*(*uint32)(unsafe.Pointer(&sbuf[4])) = ethSSFeatures
	*(*uint32)(unsafe.Pointer(&sbuf[8])) = uint32(n)
	if err := ethtool(fd, link, unsafe.Pointer(&sbuf[0])); err != nil {
		return nil, fmt.Errorf("ETHTOOL_GSTRINGS: %w", err)
	}
	// struct ethtool_gfeatures { u32 cmd; u32 size; struct { u32 available, requested, active, never_changed; } features[size]; }
	blocks := (n + 31) / 32
	fbuf := make([]byte, 8+blocks*16)
	*(*uint32)(unsafe.Pointer(&fbuf[0])) = ethtoolGFeatures
	*(*uint32)(unsafe.Pointer(&fbuf[4])) = uint32(blocks)
	if err := ethtool(fd, link, unsafe.Pointer(&fbuf[0])); err != nil {
		return nil, fmt.Errorf("ETHTOOL_GFEATURES: %w", err)
	}
	out := map[string]bool{}
	for i := 0; i < n; i++ {
		name := strings.TrimRight(string(sbuf[12+i*32:12+(i+1)*32]), "\x00")
		active := *(*uint32)(unsafe.Pointer(&fbuf[8+(i/32)*16+8]))
		out[name] = active&(1<<(i%32)) != 0
	}
	return out, nil
}

// udpSockets finds the UDP sockets bound to port in this namespace and who holds them.
func udpSockets(port int) ([]Socket, error) {
	local := map[string]string{} // inode -> local address
	for _, f := range []string{"/proc/net/udp", "/proc/net/udp6"} {
		if err := readUDPTable(f, port, local); err != nil {
			return nil, err
		}
	}
	var out []Socket
	pids, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range pids {
		pid, _ := strconv.Atoi(filepath.Base(p))
		fds, _ := os.ReadDir(filepath.Join(p, "fd"))
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join(p, "fd", fd.Name()))
			if err != nil || !strings.HasPrefix(target, "socket:[") {
				continue
			}
			inode := strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")
			addr, ok := local[inode]
			if !ok {
				continue
			}
			comm, _ := os.ReadFile(filepath.Join(p, "comm"))
			s := Socket{Local: addr, PID: pid, Process: strings.TrimSpace(string(comm))}
			n, _ := strconv.Atoi(fd.Name())
			if gro, err := udpGRO(pid, n); err == nil {
				s.UDPGRO = &gro
			}
			out = append(out, s)
			delete(local, inode)
		}
	}
	return out, nil
}

func readUDPTable(path string, port int, into map[string]string) error {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		hostPort := strings.Split(fields[1], ":")
		p, _ := strconv.ParseInt(hostPort[1], 16, 32)
		if int(p) == port {
			into[fields[9]] = fmt.Sprintf("%s %s:%d", filepath.Base(path), hostPort[0], p)
		}
	}
	return sc.Err()
}

// udpGRO reads UDP_GRO on a duplicate of process pid's descriptor fd.
func udpGRO(pid, fd int) (bool, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(pidfd)
	dup, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(dup)
	v, err := unix.GetsockoptInt(dup, unix.IPPROTO_UDP, unix.UDP_GRO)
	return v != 0, err
}
