//go:build linux

package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The sock_diag fallback of socket destroy, for kernels without the bpf_sock_destroy kfunc
// (before 6.5): dump the TCP and UDP sockets of the calling thread's network namespace over
// NETLINK_SOCK_DIAG, keep those whose peer is a target and whose cookie the reverse translation
// map knows for that peer (i.e. that the hooks translated), and send SOCK_DESTROY for each.
// SOCK_DESTROY needs CONFIG_INET_DIAG_DESTROY (and CONFIG_INET_UDP_DIAG for UDP).

const (
	sizeofSockID  = 48 // struct inet_diag_sockid
	sizeofDiagReq = 8 + sizeofSockID
	sizeofDiagMsg = 4 + sizeofSockID + 20 // struct inet_diag_msg
)

// diagSock is one socket of a dump: its family, its raw inet_diag_sockid, and what is read
// out of it.
type diagSock struct {
	family uint8
	id     [sizeofSockID]byte
	dst    netip.Addr
	dport  uint16
	cookie uint64
}

func parseDiagMsg(b []byte) (diagSock, bool) {
	if len(b) < sizeofDiagMsg {
		return diagSock{}, false
	}
	s := diagSock{family: b[0]}
	copy(s.id[:], b[4:4+sizeofSockID])
	id := s.id[:]
	s.dport = binary.BigEndian.Uint16(id[2:4])
	switch s.family {
	case unix.AF_INET:
		s.dst = netip.AddrFrom4([4]byte(id[20:24]))
	case unix.AF_INET6:
		s.dst = netip.AddrFrom16([16]byte(id[20:36])).Unmap()
	default:
		return diagSock{}, false
	}
	s.cookie = uint64(binary.NativeEndian.Uint32(id[40:44])) | uint64(binary.NativeEndian.Uint32(id[44:48]))<<32
	return s, true
}

func diagRequest(typ uint16, flags uint16, family, proto uint8, id []byte) []byte {
	b := make([]byte, unix.NLMSG_HDRLEN+sizeofDiagReq)
	binary.NativeEndian.PutUint32(b[0:4], uint32(len(b)))
	binary.NativeEndian.PutUint16(b[4:6], typ)
	binary.NativeEndian.PutUint16(b[6:8], flags|unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(b[8:12], 1) // seq: one request in flight at a time
	r := b[unix.NLMSG_HDRLEN:]
	r[0], r[1] = family, proto
	binary.NativeEndian.PutUint32(r[4:8], 0xffffffff) // every state
	copy(r[8:], id)
	return b
}

// diagExchange sends req and reads the answers until the dump ends or the ack comes, calling
// each for every answer.
func diagExchange(fd int, req []byte, each func([]byte)) error {
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("parse: %w", err)
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return errors.New("short netlink error")
				}
				if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
					return syscall.Errno(-code)
				}
				return nil // the ack of a request without a dump
			default:
				each(m.Data)
			}
		}
	}
}

// sockDiagDestroy destroys the translated sockets to targets in the calling thread's network
// namespace.
func sockDiagDestroy(targets map[Endpoint]bool, revnat *ebpf.Map, tcp, udp bool) (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if errors.Is(err, unix.EPROTONOSUPPORT) {
		return 0, fmt.Errorf("%w: no bpf_sock_destroy kfunc and no sock_diag in this kernel: %v", ErrDestroyUnsupported, err)
	}
	if err != nil {
		return 0, fmt.Errorf("sock_diag: open netlink socket: %w", err)
	}
	defer unix.Close(fd)

	destroyed := 0
	for _, p := range []struct {
		on    bool
		proto Proto
	}{{tcp, TCP}, {udp, UDP}} {
		if !p.on {
			continue
		}
		for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
			var victims []diagSock
			req := diagRequest(unix.SOCK_DIAG_BY_FAMILY, unix.NLM_F_DUMP, family, uint8(p.proto), nil)
			err := diagExchange(fd, req, func(b []byte) {
				s, ok := parseDiagMsg(b)
				if !ok || !targets[Endpoint{Addr: s.dst, Port: s.dport, Proto: p.proto}] {
					return
				}
				var key lbSockLbRevnatKey
				var val lbSockLbRevnatVal
				key.Cookie, key.Addr.B, key.Port = s.cookie, addrBytes(s.dst), netPort(s.dport)
				if revnat.Lookup(&key, &val) == nil {
					victims = append(victims, s)
				}
			})
			if errors.Is(err, unix.ENOENT) {
				// No sock_diag handler for the protocol (CONFIG_INET_DIAG, CONFIG_INET_UDP_DIAG).
				return destroyed, fmt.Errorf("%w: sock_diag cannot list %s sockets in this kernel", ErrDestroyUnsupported, p.proto)
			}
			if err != nil {
				return destroyed, fmt.Errorf("sock_diag: dump %s sockets (family %d): %w", p.proto, family, err)
			}
			for _, s := range victims {
				req := diagRequest(unix.SOCK_DESTROY, unix.NLM_F_ACK, s.family, uint8(p.proto), s.id[:])
				err := diagExchange(fd, req, func([]byte) {})
				switch {
				case err == nil:
					destroyed++
				case errors.Is(err, unix.ENOENT):
					// closed since the dump
				case errors.Is(err, unix.EOPNOTSUPP):
					return destroyed, fmt.Errorf("%w: sock_diag SOCK_DESTROY is not in this kernel (CONFIG_INET_DIAG_DESTROY)", ErrDestroyUnsupported)
				default:
					return destroyed, fmt.Errorf("sock_diag: destroy %s socket to %s: %w", p.proto, netip.AddrPortFrom(s.dst, s.dport), err)
				}
			}
		}
	}
	return destroyed, nil
}
