package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// tcpcheck capture -iface NAME -duration D: an AF_PACKET capture (no tcpdump on the test
// machines) of every packet on link NAME, both directions, for D or until SIGTERM/SIGINT. It
// prints "capturing NAME" once the socket is bound, then at the end one JSON line
// {"packets":N,"ipv4":M,"addrs":{"ip":count,...}}: every IPv4 source and destination address
// seen. A SOCK_DGRAM packet socket hands over the network-layer packet whatever the link type,
// so the inner packets of a WireGuard TUN and the frames of a VXLAN link read the same way.

type captureReport struct {
	Packets int            `json:"packets"`
	IPv4    int            `json:"ipv4"`
	Addrs   map[string]int `json:"addrs"`
}

func capture(iface string, duration time.Duration) error {
	if iface == "" {
		return errors.New("capture: -iface is required")
	}
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return fmt.Errorf("capture: link %s: %w", iface, err)
	}
	proto := htons(unix.ETH_P_ALL)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM, int(proto))
	if err != nil {
		return fmt.Errorf("capture: packet socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifc.Index}); err != nil {
		return fmt.Errorf("capture: bind to %s: %w", iface, err)
	}
	// A short receive timeout lets the loop notice the end of the capture.
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fmt.Errorf("capture: receive timeout: %w", err)
	}
	fmt.Printf("capturing %s\n", iface)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	rep := captureReport{Addrs: map[string]int{}}
	end := time.Now().Add(duration)
	buf := make([]byte, 65536)
	for time.Now().Before(end) {
		select {
		case <-stop:
			end = time.Now()
			continue
		default:
		}
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("capture: read: %w", err)
		}
		rep.Packets++
		src, dst, ok := ipv4Addrs(buf[:n])
		if !ok {
			continue
		}
		rep.IPv4++
		rep.Addrs[src.String()]++
		rep.Addrs[dst.String()]++
	}
	b, _ := json.Marshal(rep)
	fmt.Println(string(b))
	return nil
}

// ipv4Addrs reads the source and destination of an IPv4 header at the start of p.
func ipv4Addrs(p []byte) (src, dst netip.Addr, ok bool) {
	if len(p) < 20 || p[0]>>4 != 4 {
		return netip.Addr{}, netip.Addr{}, false
	}
	return netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20])), true
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}
