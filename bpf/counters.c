// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// Per-interface traffic counters of one pod interface (DESIGN §5 item 8). One copy of this
// object is loaded for every attached interface: the two classifiers are attached to that
// interface only (tcx, or clsact on kernels before 6.6) and share one per-CPU array of two
// slots, rx (ingress) and tx (egress). Observe only: every packet continues (TC_ACT_UNSPEC is
// TCX_NEXT, and "continue with the next filter" for clsact), so another tc program on the
// same interface still decides the packet's fate.
//
// Packets the kernel drops after the hook are not seen as drops here: those come from the
// link's own counters (IFLA_STATS64), read by the daemon.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// The layout the daemon reads (src/host/bpf.rs, `COUNTER_FIELDS`): six u64 per slot.
struct counters {
	__u64 bytes;
	__u64 packets;
	__u64 tcp;
	__u64 udp;
	__u64 icmp;
	__u64 other;
};

// linux/in.h names IPv4 protocols only; ICMPv6 is next header 58 (RFC 4443).
#define NEXTHDR_ICMPV6 58

#define SLOT_RX 0
#define SLOT_TX 1

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct counters);
} COUNTERS SEC(".maps");

// The L4 protocol of an Ethernet frame: IPv4's protocol field, IPv6's next header (an
// extension header counts as "other": walking the chain is not worth its cost here).
static __always_inline __u8 l4_protocol(struct __sk_buff *skb)
{
	__u8 proto = 0;
	switch (skb->protocol) {
	case bpf_htons(ETH_P_IP):
		// struct iphdr: protocol at byte 9.
		if (bpf_skb_load_bytes(skb, ETH_HLEN + 9, &proto, 1) < 0)
			return 0;
		return proto;
	case bpf_htons(ETH_P_IPV6):
		// struct ipv6hdr: nexthdr at byte 6.
		if (bpf_skb_load_bytes(skb, ETH_HLEN + 6, &proto, 1) < 0)
			return 0;
		return proto;
	default:
		return 0;
	}
}

static __always_inline int count(struct __sk_buff *skb, __u32 slot)
{
	struct counters *c = bpf_map_lookup_elem(&COUNTERS, &slot);
	if (!c)
		return TC_ACT_UNSPEC;
	// Per-CPU slots: no other CPU writes this copy, no atomics needed.
	c->bytes += skb->len;
	c->packets += 1;
	switch (l4_protocol(skb)) {
	case IPPROTO_TCP:
		c->tcp += 1;
		break;
	case IPPROTO_UDP:
		c->udp += 1;
		break;
	case IPPROTO_ICMP:
	case NEXTHDR_ICMPV6:
		c->icmp += 1;
		break;
	default:
		c->other += 1;
		break;
	}
	return TC_ACT_UNSPEC;
}

// aya 0.14 knows tc programs only by the section name "classifier".
SEC("classifier")
int netclaim_rx(struct __sk_buff *skb)
{
	return count(skb, SLOT_RX);
}

SEC("classifier")
int netclaim_tx(struct __sk_buff *skb)
{
	return count(skb, SLOT_TX);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
