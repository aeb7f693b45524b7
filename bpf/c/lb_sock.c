// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Socket load balancing for clusterset VIPs, in the manner of Cilium's socket LB: the
 * cgroup sock_addr hooks rewrite the destination of connect() and of UDP sendmsg() from a
 * VIP to one of its backends, so there is no per-packet NAT; recvmsg() and getpeername()
 * translate the backend back to the VIP so the application only ever sees the VIP.
 *
 * TCP (and SCTP) are translated once per connection in connect. UDP is translated once per
 * socket: the first datagram (or connect) picks a backend, remembered by socket cookie.
 */
#include "lb.h"

#define SYS_REJECT 0
#define SYS_PROCEED 1

/* Not in the UAPI headers of every distribution. */
#ifndef EHOSTUNREACH
#define EHOSTUNREACH 113
#endif

char __license[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_MAX_AFFINITY);
	__type(key, struct lb_aff_key);
	__type(value, __u32); /* backend id */
	__uint(pinning, LB_PINNING);
} cm_lb_udp_aff SEC(".maps");

static __always_inline void addr_from_v4(struct lb_addr *a, __u32 ip4)
{
	__u32 w[4] = {0, 0, bpf_htonl(0x0000ffff), ip4};

	__builtin_memcpy(a->b, w, sizeof(w));
}

static __always_inline void addr_from_v6(struct lb_addr *a, struct bpf_sock_addr *ctx)
{
	/* The context only allows 4-byte loads of user_ip6. */
	__u32 w[4] = {ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3]};

	__builtin_memcpy(a->b, w, sizeof(w));
}

static __always_inline int addr_equal(const struct lb_addr *a, const struct lb_addr *b)
{
	__u32 x[4], y[4];

	/* By words: clang does not inline __builtin_memcmp for BPF. */
	__builtin_memcpy(x, a->b, sizeof(x));
	__builtin_memcpy(y, b->b, sizeof(y));
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3];
}

static __always_inline int addr_is_v4(const struct lb_addr *a)
{
	__u32 w[3];

	__builtin_memcpy(w, a->b, sizeof(w));
	return w[0] == 0 && w[1] == 0 && w[2] == bpf_htonl(0x0000ffff);
}

static __always_inline void ctx_set_addr(struct bpf_sock_addr *ctx, const struct lb_addr *a, int v6)
{
	__u32 w[4];

	__builtin_memcpy(w, a->b, sizeof(w));
	if (v6) {
		ctx->user_ip6[0] = w[0];
		ctx->user_ip6[1] = w[1];
		ctx->user_ip6[2] = w[2];
		ctx->user_ip6[3] = w[3];
	} else {
		ctx->user_ip4 = w[3];
	}
}

static __always_inline void ctx_get_addr(struct bpf_sock_addr *ctx, struct lb_addr *a, int v6)
{
	if (v6)
		addr_from_v6(a, ctx);
	else
		addr_from_v4(a, ctx->user_ip4);
}

static __always_inline int proto_known(__u32 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP;
}

/* The backend in a random slot of the service: an even spread over its backends. */
static __always_inline struct lb_backend *pick_backend(struct lb_svc_key *key,
						       const struct lb_svc_val *svc, __u32 *id)
{
	struct lb_svc_val *slot;

	key->slot = (bpf_get_prandom_u32() % svc->count) + 1;
	slot = bpf_map_lookup_elem(&cm_lb_svc, key);
	key->slot = 0;
	if (!slot)
		return NULL;
	*id = slot->id;
	return bpf_map_lookup_elem(&cm_lb_backend, id);
}

/* Remembers which VIP the socket talks to behind the backend, for recvmsg and getpeername
 * (and for the destroy iterators). Written only when missing or different, since a hash
 * map update on every UDP datagram costs more than the lookup. */
static __always_inline void remember_revnat(__u64 cookie, const struct lb_backend *be,
					    const struct lb_svc_key *key)
{
	struct lb_revnat_key rk = {.cookie = cookie, .addr = be->addr, .port = be->port};
	struct lb_revnat_val rv = {.vip = key->addr, .port = key->port, .proto = key->proto};
	struct lb_revnat_val *cur;

	cur = bpf_map_lookup_elem(&cm_lb_revnat, &rk);
	if (cur && cur->port == rv.port && cur->proto == rv.proto && addr_equal(&cur->vip, &rv.vip))
		return;
	bpf_map_update_elem(&cm_lb_revnat, &rk, &rv, BPF_ANY);
}

/* Forward translation, shared by connect4/6 and sendmsg4/6. Returns the hook's verdict. */
static __always_inline int xlate_fwd(struct bpf_sock_addr *ctx, int v6)
{
	struct lb_svc_key key = {};
	struct lb_svc_val *svc;
	struct lb_backend *be = NULL;
	__u32 proto = ctx->protocol;
	__u32 id = 0;
	__u64 cookie;

	if (!proto_known(proto))
		return SYS_PROCEED;
	ctx_get_addr(ctx, &key.addr, v6);
	key.port = (__be16)ctx->user_port;
	key.proto = proto;

	svc = bpf_map_lookup_elem(&cm_lb_svc, &key);
	if (!svc)
		return SYS_PROCEED; /* not a VIP */
	if (svc->count == 0)
		goto unreachable;

	cookie = bpf_get_socket_cookie(ctx);
	if (proto == IPPROTO_UDP) {
		struct lb_aff_key ak = {.cookie = cookie, .vip = key.addr, .port = key.port, .proto = key.proto};
		__u32 *aff = bpf_map_lookup_elem(&cm_lb_udp_aff, &ak);

		if (aff) {
			id = *aff;
			be = bpf_map_lookup_elem(&cm_lb_backend, &id);
			/* A removed backend's id may since belong to another service's backend. */
			if (be && be->svc_id != svc->id)
				be = NULL;
		}
		if (!be) {
			be = pick_backend(&key, svc, &id);
			if (!be)
				goto unreachable;
			bpf_map_update_elem(&cm_lb_udp_aff, &ak, &id, BPF_ANY);
		}
	} else {
		be = pick_backend(&key, svc, &id);
		if (!be)
			goto unreachable;
	}
	/* An IPv4 hook can only carry an IPv4 backend (the loader refuses mixed families, but a
	 * v4-mapped VIP reached from an IPv6 socket needs nothing more). */
	if (!v6 && !addr_is_v4(&be->addr))
		goto unreachable;

	remember_revnat(cookie, be, &key);
	ctx_set_addr(ctx, &be->addr, v6);
	ctx->user_port = (__u32)be->port;
	return SYS_PROCEED;

unreachable:
	/* Returning 0 alone fails the syscall with EPERM; the retval set here replaces it
	 * (kernel 5.18+, as Cilium does), so clients see "no route to host" at once. */
	bpf_set_retval(-EHOSTUNREACH);
	return SYS_REJECT;
}

/* Reverse translation for recvmsg and getpeername: the backend becomes the VIP again. These
 * hooks cannot fail the syscall; they must always proceed. */
static __always_inline int xlate_rev(struct bpf_sock_addr *ctx, int v6)
{
	struct lb_revnat_key rk = {};
	struct lb_revnat_val *rv;
	struct lb_svc_key key = {};

	ctx_get_addr(ctx, &rk.addr, v6);
	rk.port = (__be16)ctx->user_port;
	rk.cookie = bpf_get_socket_cookie(ctx);

	rv = bpf_map_lookup_elem(&cm_lb_revnat, &rk);
	if (!rv)
		return SYS_PROCEED;
	key.addr = rv->vip;
	key.port = rv->port;
	key.proto = rv->proto;
	if (!bpf_map_lookup_elem(&cm_lb_svc, &key)) {
		/* The service is gone: show the real peer, and forget the entry. */
		bpf_map_delete_elem(&cm_lb_revnat, &rk);
		return SYS_PROCEED;
	}
	ctx_set_addr(ctx, &rv->vip, v6);
	ctx->user_port = (__u32)rv->port;
	return SYS_PROCEED;
}

SEC("cgroup/connect4")
int cm_connect4(struct bpf_sock_addr *ctx)
{
	return xlate_fwd(ctx, 0);
}

SEC("cgroup/sendmsg4")
int cm_sendmsg4(struct bpf_sock_addr *ctx)
{
	return xlate_fwd(ctx, 0);
}

SEC("cgroup/recvmsg4")
int cm_recvmsg4(struct bpf_sock_addr *ctx)
{
	return xlate_rev(ctx, 0);
}

SEC("cgroup/getpeername4")
int cm_getpeername4(struct bpf_sock_addr *ctx)
{
	return xlate_rev(ctx, 0);
}

SEC("cgroup/connect6")
int cm_connect6(struct bpf_sock_addr *ctx)
{
	return xlate_fwd(ctx, 1);
}

SEC("cgroup/sendmsg6")
int cm_sendmsg6(struct bpf_sock_addr *ctx)
{
	return xlate_fwd(ctx, 1);
}

SEC("cgroup/recvmsg6")
int cm_recvmsg6(struct bpf_sock_addr *ctx)
{
	return xlate_rev(ctx, 1);
}

SEC("cgroup/getpeername6")
int cm_getpeername6(struct bpf_sock_addr *ctx)
{
	return xlate_rev(ctx, 1);
}
