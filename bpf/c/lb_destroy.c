// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Socket destroy: TCP and UDP socket iterators that abort the sockets this load balancer
 * translated to a backend that has gone, so their clients fail fast (ECONNABORTED) instead
 * of waiting for a timeout. A socket is destroyed only when its peer is one of the targets
 * AND the reverse translation map knows its cookie for that peer: a socket someone opened
 * to the backend's address directly is left alone.
 *
 * An iterator walks the sockets of the network namespace it was opened in; the loader opens
 * it once per namespace of the client processes. It needs the bpf_sock_destroy kfunc (Linux
 * 6.5); the loader falls back to sock_diag where it is missing.
 *
 * Kernel structures are declared minimally here and relocated with CO-RE against the
 * running kernel's BTF, instead of a generated vmlinux.h.
 */
#define LB_PINNING 0 /* the loader replaces cm_lb_revnat with the hooks' (pinned) map */
#include "lb.h"
#include <bpf/bpf_core_read.h>

char __license[] SEC("license") = "Dual BSD/GPL";

#define AF_INET 2
#define AF_INET6 10
#define TCP_TIME_WAIT 6
#define TCP_NEW_SYN_RECV 12

struct seq_file;

struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));

struct in6_addr {
	union {
		__u8 u6_addr8[16];
	} in6_u;
} __attribute__((preserve_access_index));

struct sock_common {
	__be32 skc_daddr;
	__be16 skc_dport;
	unsigned short skc_family;
	volatile unsigned char skc_state;
	struct in6_addr skc_v6_daddr;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
} __attribute__((preserve_access_index));

struct udp_sock;

struct bpf_iter__tcp {
	struct bpf_iter_meta *meta;
	struct sock_common *sk_common;
} __attribute__((preserve_access_index));

struct bpf_iter__udp {
	struct bpf_iter_meta *meta;
	struct udp_sock *udp_sk;
} __attribute__((preserve_access_index));

extern int bpf_sock_destroy(struct sock_common *sk) __ksym;

/* The peers whose translated sockets go: backend address, port, protocol. Filled by the
 * loader for one run and emptied after. */
struct lb_target {
	struct lb_addr addr;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct lb_target);
	__type(value, __u8);
} cm_lb_targets SEC(".maps");

/* Destroys skc if it is a translated socket to a target; the cookie of each destroyed
 * socket goes to the iterator's output, which the loader counts. */
static __always_inline void destroy_if_target(struct bpf_iter_meta *meta, struct sock_common *skc,
					      __u8 proto)
{
	struct lb_target t = {.proto = proto};
	struct lb_revnat_key rk = {};
	unsigned short family;
	__u64 cookie;

	family = skc->skc_family;
	if (family == AF_INET) {
		__u32 w[4] = {0, 0, bpf_htonl(0x0000ffff), skc->skc_daddr};

		__builtin_memcpy(t.addr.b, w, sizeof(w));
	} else if (family == AF_INET6) {
		if (bpf_core_read(t.addr.b, sizeof(t.addr.b), &skc->skc_v6_daddr.in6_u.u6_addr8))
			return;
	} else {
		return;
	}
	t.port = skc->skc_dport;
	if (!bpf_map_lookup_elem(&cm_lb_targets, &t))
		return;

	cookie = bpf_get_socket_cookie(skc);
	rk.cookie = cookie;
	rk.addr = t.addr;
	rk.port = t.port;
	if (!bpf_map_lookup_elem(&cm_lb_revnat, &rk))
		return;
	if (bpf_sock_destroy(skc) == 0)
		bpf_seq_write(meta->seq, &cookie, sizeof(cookie));
}

SEC("iter/tcp")
int cm_destroy_tcp(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	unsigned char state;

	if (!skc)
		return 0;
	/* Time-wait and request sockets are not full sockets: nothing to abort. */
	state = skc->skc_state;
	if (state == TCP_TIME_WAIT || state == TCP_NEW_SYN_RECV)
		return 0;
	destroy_if_target(ctx->meta, skc, IPPROTO_TCP);
	return 0;
}

SEC("iter/udp")
int cm_destroy_udp(struct bpf_iter__udp *ctx)
{
	struct sock *sk = (struct sock *)ctx->udp_sk;

	if (!sk)
		return 0;
	destroy_if_target(ctx->meta, &sk->__sk_common, IPPROTO_UDP);
	return 0;
}
