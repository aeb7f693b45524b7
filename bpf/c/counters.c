// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Per-remote-cluster traffic counters on the cable interfaces, for `cablectl status`: a tcx
 * program on ingress and one on egress look up the remote address (source on ingress,
 * destination on egress) in an LPM map of remote subnets the agent fills, and add the packet
 * to that cluster's per-CPU counters. They never change a verdict (TCX_NEXT).
 *
 * They run for every packet (every GSO/GRO super-packet) on the cable links, so the common case is
 * kept short: the IP header is read in place (direct packet access, the helper call only when the
 * header is not in the linear part), and each CPU remembers, per direction, the last address it
 * looked up and the cluster found, so a stream's packets skip the LPM trie walk.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char __license[] SEC("license") = "Dual BSD/GPL";

#define TCX_NEXT (-1) /* linux/bpf.h of 6.6+; spelled out for older UAPI headers */
#define MAX_CLUSTERS 256 /* cluster IDs are 1..255 */

/* Where the IP header starts: 14 on Ethernet-like devices (veth, vxlan), 0 on L3 devices
 * (TUN: wireguard-go, kernel-libipsec). Set by the loader per interface. */
volatile const __u32 l3_offset = ETH_HLEN;

struct subnet_key {
	__u32 prefixlen; /* of the 128-bit address; IPv4 subnets are IPv4-mapped (+96) */
	__u8 addr[16];
};

struct cluster_stats {
	__u64 rx_packets;
	__u64 rx_bytes;
	__u64 tx_packets;
	__u64 tx_bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 4096);
	__type(key, struct subnet_key);
	__type(value, __u32); /* cluster ID */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cm_ctr_subnet SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_CLUSTERS);
	__type(key, __u32);
	__type(value, struct cluster_stats);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cm_ctr_stats SEC(".maps");

/* The subnet map's generation: the loader adds one after every change to cm_ctr_subnet, which
 * invalidates every CPU's cache entry at once. 0 until the first change: never a valid entry. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cm_ctr_gen SEC(".maps");

/* One CPU's last lookup in one direction (index 0 egress, 1 ingress). */
struct lookup_cache {
	__u32 gen;
	__u32 cluster;
	__u32 addr[4];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct lookup_cache);
} cm_ctr_cache SEC(".maps");

/* Copies n bytes at offset off of the packet to dst: in place when they are in the linear part,
 * else with the helper. */
static __always_inline int load(struct __sk_buff *skb, __u32 off, void *dst, __u32 n)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	if (n == 4 && data + off + 4 <= data_end) {
		__builtin_memcpy(dst, data + off, 4);
		return 0;
	}
	if (n == 16 && data + off + 16 <= data_end) {
		__builtin_memcpy(dst, data + off, 16);
		return 0;
	}
	return bpf_skb_load_bytes(skb, off, dst, n);
}

/* The cluster of key's address: from this CPU's cache when it holds that address at the current
 * generation, else from the LPM trie (and then cached). The generation is read before the trie,
 * so an entry can only be stamped with a generation older than what it was looked up in. */
static __always_inline __u32 lookup_cluster(struct subnet_key *key, __u32 dir)
{
	__u32 zero = 0, cluster = 0, g;
	__u32 *gen = bpf_map_lookup_elem(&cm_ctr_gen, &zero);
	struct lookup_cache *c = bpf_map_lookup_elem(&cm_ctr_cache, &dir);
	__u32 a[4];
	__u32 *id;

	__builtin_memcpy(a, key->addr, sizeof(a));
	if (!gen || !c)
		return 0;
	g = *gen;
	if (g != 0 && c->gen == g && c->addr[0] == a[0] && c->addr[1] == a[1] && c->addr[2] == a[2] &&
	    c->addr[3] == a[3])
		return c->cluster;
	id = bpf_map_lookup_elem(&cm_ctr_subnet, key);
	if (id)
		cluster = *id;
	c->gen = g;
	c->cluster = cluster;
	__builtin_memcpy(c->addr, a, sizeof(a));
	return cluster;
}

/* The cluster of the remote address of the packet, or 0. */
static __always_inline __u32 remote_cluster(struct __sk_buff *skb, int ingress)
{
	struct subnet_key key = {.prefixlen = 128};
	__u32 off = l3_offset;

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		__u32 w[3] = {0, 0, bpf_htonl(0x0000ffff)};

		__builtin_memcpy(key.addr, w, sizeof(w));
		if (load(skb, off + (ingress ? 12 : 16), &key.addr[12], 4))
			return 0;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		if (load(skb, off + (ingress ? 8 : 24), key.addr, 16))
			return 0;
	} else {
		return 0;
	}
	return lookup_cluster(&key, ingress ? 1 : 0);
}

static __always_inline void count(struct __sk_buff *skb, int ingress)
{
	__u32 cluster = remote_cluster(skb, ingress);
	struct cluster_stats *st;

	if (cluster == 0 || cluster >= MAX_CLUSTERS)
		return;
	st = bpf_map_lookup_elem(&cm_ctr_stats, &cluster);
	if (!st)
		return;
	/* Per-CPU values: plain adds, no atomics; the loader sums the CPUs. */
	if (ingress) {
		st->rx_packets++;
		st->rx_bytes += skb->len;
	} else {
		st->tx_packets++;
		st->tx_bytes += skb->len;
	}
}

SEC("tcx/ingress")
int cm_ctr_ingress(struct __sk_buff *skb)
{
	count(skb, 1);
	return TCX_NEXT;
}

SEC("tcx/egress")
int cm_ctr_egress(struct __sk_buff *skb)
{
	count(skb, 0);
	return TCX_NEXT;
}
