// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The vxlan cable's transmit fast path: a tcx egress program on the cable's VXLAN links that
 * builds the outer Ethernet, IPv4, UDP and VXLAN headers itself and hands the packet straight to
 * the underlay link, where the kernel would run the VXLAN device's transmit (FDB lookup, outer
 * route and neighbour, the outer packet's netfilter hooks and IP output) for every packet.
 *
 * It is a shortcut, never a second datapath: whatever it does not handle it returns to the
 * kernel (TCX_NEXT), so the VXLAN device sends those packets exactly as without it:
 *   - frames whose destination MAC is no remote VTEP of this link (broadcast, ARP, anything the
 *     agent did not put in cm_vxf_remote), and non-IPv4 inner packets;
 *   - packets whose underlay route or neighbour bpf_fib_lookup cannot resolve (the kernel's
 *     transmit resolves the neighbour, and the next packet takes the shortcut);
 *   - packets whose inner IPv4 header is not in the linear part, and packets whose outer IPv4
 *     length would not fit 16 bits (a GSO packet larger than TCP ever builds).
 * The outer headers are the kernel's for a device made as the cable makes it (no `df`, `tos` or
 * `ttl` options, no UDP checksum): DF clear, TOS 0 with the inner packet's ECN encapsulated as
 * RFC 6040 says (CE becomes ECT(0)), the route's TTL (the loader passes the namespace's default),
 * the source port hashed from the flow into the device's port range as udp_flow_src_port() does.
 * A GSO packet stays one packet (BPF_F_ADJ_ROOM_FIXED_GSO keeps the inner MSS, which the link's
 * MTU already made fit) and is segmented, if ever, as the kernel's own VXLAN GSO packets are.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char __license[] SEC("license") = "Dual BSD/GPL";

#define TCX_NEXT (-1)     /* linux/bpf.h of 6.6+; spelled out for older UAPI headers */
#define TC_ACT_SHOT 2
#define AF_INET 2
#define VXLAN_FLAG_VNI 0x08000000 /* the I flag: the VNI is valid */
#define IP_DF 0x4000
#define ENCAP_LEN (sizeof(struct iphdr) + sizeof(struct udphdr) + sizeof(struct vxlan_hdr) + ETH_HLEN)

struct vxlan_hdr {
	__be32 flags;
	__be32 vni; /* VNI << 8 */
};

/* A remote VTEP as one VXLAN link reaches it: the link and the remote device's MAC (the
 * destination MAC the link's neighbour entry gives the inner frame). */
struct vxf_key {
	__u32 ifindex;
	__u8 mac[ETH_ALEN];
	__u16 pad;
};

struct vxf_remote {
	__be32 remote;     /* outer destination */
	__be32 local;      /* outer source */
	__be32 vni;        /* VNI << 8, network order */
	__be16 dport;      /* network order */
	__u16 sport_min;   /* host order: the device's source port range [min, max) */
	__u16 sport_max;
	__u8 ttl;
	__u8 pad;
	__u32 oif;         /* the underlay link the device is bound to */
};

/* Packets and bytes (of the inner IP packets) each link sent through the shortcut, for the link's
 * own TX counters, which the kernel no longer updates for them. */
struct vxf_stats {
	__u64 packets;
	__u64 bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct vxf_key);
	__type(value, struct vxf_remote);
} cm_vxf_remote SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 256);
	__type(key, __u32); /* ifindex */
	__type(value, struct vxf_stats);
} cm_vxf_stats SEC(".maps");

/* udp_flow_src_port(): the flow hash scaled into [min, max). */
static __always_inline __u16 src_port(__u32 hash, __u16 min, __u16 max)
{
	hash ^= hash << 16;
	return (__u16)((((__u64)hash) * (max - min)) >> 32) + min;
}

/* INET_ECN_encapsulate(0, inner): the outer ECN field is the inner one, CE sent as ECT(0). */
static __always_inline __u8 ecn_encap(__u8 inner_tos)
{
	__u8 ecn = inner_tos & 3;
	return ecn == 3 ? 2 : ecn;
}

static __always_inline __u16 ip_csum(struct iphdr *ip)
{
	__u16 *p = (__u16 *)ip;
	__u32 sum = 0;
#pragma clang loop unroll(full)
	for (int i = 0; i < (int)(sizeof(*ip) / 2); i++)
		sum += p[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

SEC("tc")
int cm_vxf_encap(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *inner_ip = (void *)(eth + 1);
	if ((void *)(inner_ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return TCX_NEXT;

	struct vxf_key key = {.ifindex = skb->ifindex};
	__builtin_memcpy(key.mac, eth->h_dest, ETH_ALEN);
	struct vxf_remote *r = bpf_map_lookup_elem(&cm_vxf_remote, &key);
	if (!r)
		return TCX_NEXT;

	/* The outer length must fit the 16-bit tot_len (TCP's GSO packets stay below it). */
	if (skb->len - ETH_HLEN + ENCAP_LEN > 0xffff)
		return TCX_NEXT;

	struct ethhdr inner_eth = *eth;
	__u8 tos = ecn_encap(inner_ip->tos);
	__u16 sport = src_port(bpf_get_hash_recalc(skb), r->sport_min, r->sport_max);

	/* tot_len 0: no MTU check; the link's MTU already bounds the inner packet. */
	struct bpf_fib_lookup fib = {
		.family = AF_INET,
		.l4_protocol = IPPROTO_UDP,
		.sport = bpf_htons(sport),
		.dport = r->dport,
		.ipv4_src = r->local,
		.ipv4_dst = r->remote,
		.ifindex = r->oif,
	};
	if (bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_OUTPUT) != BPF_FIB_LKUP_RET_SUCCESS)
		return TCX_NEXT;

	__u32 inner_len = skb->len;
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP |
		      BPF_F_ADJ_ROOM_ENCAP_L2_ETH | BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN);
	if (bpf_skb_adjust_room(skb, ENCAP_LEN, BPF_ADJ_ROOM_MAC, flags))
		return TCX_NEXT; /* nothing changed: the kernel sends it */

	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct udphdr *udp = (void *)(ip + 1);
	struct vxlan_hdr *vx = (void *)(udp + 1);
	struct ethhdr *ieth = (void *)(vx + 1);
	if ((void *)(ieth + 1) > end)
		return TC_ACT_SHOT; /* the room was made in the linear part: never */

	__builtin_memcpy(eth->h_dest, fib.dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, fib.smac, ETH_ALEN);
	eth->h_proto = bpf_htons(ETH_P_IP);
	*ieth = inner_eth;

	__u16 outer_len = inner_len - ETH_HLEN + ENCAP_LEN; /* the outer IPv4 packet */
	struct iphdr o = {
		.version = 4,
		.ihl = 5,
		.tos = tos,
		.tot_len = bpf_htons(outer_len),
		.id = (__u16)bpf_get_prandom_u32(),
		.frag_off = 0,
		.ttl = r->ttl,
		.protocol = IPPROTO_UDP,
		.saddr = r->local,
		.daddr = r->remote,
	};
	o.check = ip_csum(&o);
	*ip = o;
	udp->source = bpf_htons(sport);
	udp->dest = r->dport;
	udp->len = bpf_htons(outer_len - sizeof(struct iphdr));
	udp->check = 0;
	vx->flags = bpf_htonl(VXLAN_FLAG_VNI);
	vx->vni = r->vni;

	__u32 ifindex = skb->ifindex;
	struct vxf_stats *st = bpf_map_lookup_elem(&cm_vxf_stats, &ifindex);
	if (st) {
		st->packets++;
		st->bytes += inner_len - ETH_HLEN; /* the inner IP packet, as iptunnel_xmit_stats() counts */
	}
	return bpf_redirect(fib.ifindex, 0);
}
