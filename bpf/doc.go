// Package bpf is Cablemesh's eBPF datapath for services: socket load balancing of clusterset
// VIPs to backends in connected clusters, in the manner of Cilium's socket LB, and per-cluster
// traffic counters on the cable interfaces.
//
// # Socket load balancing
//
// Open loads eight cgroup sock_addr programs (c/lb_sock.c) and attaches them to
// Options.CgroupPath: connect4/6 and sendmsg4/6 rewrite a VIP destination to a backend,
// recvmsg4/6 and getpeername4/6 show the VIP again. There is no per-packet NAT: a TCP (or SCTP)
// connection is translated once, in connect; a UDP socket once, by its first datagram or its
// connect, after which its cookie maps to that backend for all its datagrams. The backend is
// chosen at random among the service's backends (an even spread); the agent passes only the
// eligible ones (ready, healthy, local cluster preferred).
//
// Sync makes the maps hold exactly the given services, writing only the differences, in an
// order that never shows a service with backends as empty (see plan.go). A service with no
// backends stays in the maps so that connect() fails at once with EHOSTUNREACH: the hook sets
// it with bpf_set_retval and rejects (returning 0 alone would give EPERM), as Cilium does;
// sendmsg() on UDP fails the same way. This needs Linux 5.18.
//
// IPv4 and IPv6 VIPs share one service map, IPv4 in its IPv4-mapped form, so an IPv6 socket
// that connects to ::ffff:<IPv4 VIP> is translated too. A service's backends are of its VIP's
// family.
//
// # Pins and restarts
//
// Everything is pinned under Options.PinDir, one directory per agent on bpffs: the maps by
// name, the links under PinDir/links. Mounting bpffs (mount -t bpf bpf /sys/fs/bpf) is the
// caller's job; Open and OpenCounters refuse a PinDir that is not on it. Close releases file
// descriptors only: the hooks stay attached and keep translating, and open connections keep
// their reverse translation. The next Open adopts the pinned maps and links, and replaces a
// link's program in place (link.Update) only when it differs from this build's; nothing is
// detached. Remove, or Purge on a PinDir, detaches and unpins everything.
//
// # Destroying sockets of removed backends
//
// DestroySockets aborts the open TCP connections and connected UDP sockets that were
// translated to backends that have gone (Gone computes them from two Syncs' inputs), so their
// clients get ECONNABORTED instead of waiting for a timeout. Only sockets the hooks translated
// are touched: the reverse translation map must know the socket's cookie for that peer.
// Sockets live in the network namespaces of the client processes (pods), so it visits the
// network namespace of every process below CgroupPath, entering each on a locked thread. In
// each it runs socket iterators (c/lb_destroy.c) that call the bpf_sock_destroy kfunc (Linux
// 6.5); without it, it dumps sockets over netlink sock_diag and sends SOCK_DESTROY (needs
// CONFIG_INET_DIAG_DESTROY). Limits: SCTP sockets cannot be destroyed; a socket whose reverse
// translation entry was evicted from its LRU map (more than 65536 translated sockets alive at
// once) is not found; unconnected UDP sockets are not destroyed but move to another backend
// with their next datagram.
//
// # Counters
//
// OpenCounters and Attach put tcx programs (c/counters.c) on ingress and egress of a cable
// interface; they count packets and bytes per remote cluster, found by the remote address in
// an LPM map of subnets the agent sets with SetSubnets. Read sums them over the CPUs.
//
// The C sources are compiled by bpf2go (see gen.go); the generated Go and objects are
// committed so that building needs no clang.
package bpf
