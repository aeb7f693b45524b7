/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The socket load balancer's maps, shared by the cgroup hooks (lb_sock.c) and the socket
 * destroy iterators (lb_destroy.c). The Go side mirrors these layouts through the types
 * bpf2go generates from this file, so a change here shows up as a compile error there.
 *
 * Addresses are 16 bytes everywhere: an IPv6 address, or an IPv4 one in its IPv4-mapped
 * form (::ffff:a.b.c.d). One service map then serves both families, and a dual-stack IPv6
 * socket that connects to ::ffff:<v4 VIP> finds the IPv4 service with no special case.
 * Ports are in network byte order, as the kernel hands them to the hooks.
 */
#ifndef CABLEMESH_LB_H
#define CABLEMESH_LB_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define LB_MAX_SERVICE_ENTRIES 65536 /* service entries plus their backend slots */
#define LB_MAX_BACKENDS 65536
#define LB_MAX_REVNAT 65536          /* translated sockets remembered for reverse translation */
#define LB_MAX_AFFINITY 65536        /* UDP sockets remembered with the backend they were given */

#ifndef IPPROTO_SCTP
#define IPPROTO_SCTP 132
#endif

/* Whether the maps of this header are pinned by name (under the loader's PinPath).
 * lb_destroy.c shares them with the hooks through map replacement, so it does not pin. */
#ifndef LB_PINNING
#define LB_PINNING LIBBPF_PIN_BY_NAME
#endif

struct lb_addr {
	__u8 b[16];
};

/* A service is the entry with slot 0; slots 1..count of the same VIP, port and protocol
 * hold the ids of its backends (Cilium's layout: picking a backend is one random slot). */
struct lb_svc_key {
	struct lb_addr addr;
	__be16 port;
	__u8 proto;
	__u8 pad;
	__u16 slot;
	__u16 pad2;
};

struct lb_svc_val {
	__u32 id;    /* slot 0: the service's id; slot n: a backend id */
	__u16 count; /* slot 0: number of backend slots; 0 means "fail connects at once" */
	__u16 flags;
};

/* A backend belongs to exactly one service (svc_id): a UDP socket's remembered backend is
 * still valid only while the backend with that id is a backend of the service it sends to. */
struct lb_backend {
	struct lb_addr addr;
	__be16 port;
	__u16 pad;
	__u32 cluster_id;
	__u32 svc_id;
};

/* Reverse translation: which VIP a translated socket (by cookie) talks to behind which
 * backend. Read by recvmsg/getpeername, and by the destroy iterators to find the sockets
 * this load balancer translated. */
struct lb_revnat_key {
	__u64 cookie;
	struct lb_addr addr; /* backend */
	__be16 port;         /* backend */
	__u16 pad[3];
};

struct lb_revnat_val {
	struct lb_addr vip;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

/* The backend a UDP socket was given for a VIP, so that every datagram of the socket goes
 * to the same backend (translation once per socket, not per datagram). */
struct lb_aff_key {
	__u64 cookie;
	struct lb_addr vip;
	__be16 port;
	__u8 proto;
	__u8 pad[5];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_SERVICE_ENTRIES);
	__type(key, struct lb_svc_key);
	__type(value, struct lb_svc_val);
	__uint(pinning, LB_PINNING);
} cm_lb_svc SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct lb_backend);
	__uint(pinning, LB_PINNING);
} cm_lb_backend SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_MAX_REVNAT);
	__type(key, struct lb_revnat_key);
	__type(value, struct lb_revnat_val);
	__uint(pinning, LB_PINNING);
} cm_lb_revnat SEC(".maps");

#endif /* CABLEMESH_LB_H */
