// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// Per-interface traffic counters and bandwidth ceilings of one pod interface (DESIGN §5 item
// 8, §3 `bandwidth`). One copy of this object is loaded for every hooked interface: the two
// classifiers are attached to that interface only (tcx, or clsact on kernels before 6.6), one
// per direction, and do both jobs, so a ceiling costs no second program on the packet's path:
//
// - counting, into a per-CPU array of two slots, rx (ingress) and tx (egress);
// - egress pacing (Earliest Departure Time): when the tx slot of CEILINGS has a rate, each
//   packet gets a departure time in `skb->tstamp`; the `fq` qdisc on the interface holds it
//   until then (a qdisc without time-based release ignores the stamp);
// - ingress policing: when the rx slot has a rate, packets above it are dropped.
//
// Without a ceiling the programs only observe: every packet continues (TC_ACT_UNSPEC is
// TCX_NEXT, and "continue with the next filter" for clsact), so another tc program on the
// same interface still decides the packet's fate. Packets the kernel drops after the hook are
// not seen here: those come from the link's own counters (IFLA_STATS64), read by the daemon.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// The layout the daemon reads (src/host/bpf.rs, `RawCounters`): eight u64 per slot, one
// cache line.
struct counters {
	__u64 bytes;
	__u64 packets;
	__u64 tcp;
	__u64 udp;
	__u64 icmp;
	__u64 other;
	// Dropped by the ceiling: egress packets whose departure would be beyond the horizon,
	// ingress packets over the police rate. Counted in `bytes`/`packets` too (they reached
	// the hook).
	__u64 ceiling_drops;
	// Egress packets given a departure time later than now: the ceiling held them back.
	__u64 delayed;
};

// The ceiling of one direction (src/host/bpf/pacing.rs, `RawCeiling`). The daemon writes the
// first two fields (and the two it keeps for itself); `next` belongs to the programs.
struct ceiling {
	// Nanoseconds one byte takes at the rate, times 2^20 (8e9 << 20 / bits per second): a
	// multiplication and a shift per packet instead of a 64-bit division. 0: no ceiling.
	__u64 scaled_ns_per_byte;
	// Egress: the latest departure accepted, in ns from now (later: dropped). Ingress: the
	// burst tolerance of the policer, in ns of traffic at the rate.
	__u64 horizon_ns;
	// The earliest free departure time (CLOCK_MONOTONIC ns, the clock fq compares
	// skb->tstamp with): each packet reserves [max(next, now), +its length at the rate).
	__u64 next;
	// The daemon's own record of what it attached to (netns inode, ifindex); not read here.
	__u64 owner_netns;
	__u64 owner_ifindex;
};

// linux/in.h names IPv4 protocols only; ICMPv6 is next header 58 (RFC 4443).
#define NEXTHDR_ICMPV6 58

#define SLOT_RX 0
#define SLOT_TX 1

// 2^20: the fixed-point scale of `scaled_ns_per_byte`.
#define SCALE_SHIFT 20

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct counters);
} COUNTERS SEC(".maps");

// Shared by every CPU (one interface's rate is one budget, whichever CPU sends).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct ceiling);
} CEILINGS SEC(".maps");

// The L4 protocol of an Ethernet frame: IPv4's protocol field, IPv6's next header (an
// extension header counts as "other": walking the chain is not worth its cost here). Read in
// place when the bytes are in the linear part (cls_bpf computed data/data_end before the
// program ran; at ingress it pushed the MAC header back), with bpf_skb_load_bytes otherwise:
// the helper call was most of the program's own time.
static __always_inline __u8 l4_protocol(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u32 offset;
	__u8 proto = 0;

	switch (skb->protocol) {
	case bpf_htons(ETH_P_IP):
		// struct iphdr: protocol at byte 9.
		offset = ETH_HLEN + 9;
		break;
	case bpf_htons(ETH_P_IPV6):
		// struct ipv6hdr: nexthdr at byte 6.
		offset = ETH_HLEN + 6;
		break;
	default:
		return 0;
	}
	if (data + ETH_HLEN + 10 <= data_end)
		return *(__u8 *)(data + offset);
	if (bpf_skb_load_bytes(skb, offset, &proto, 1) < 0)
		return 0;
	return proto;
}

static __always_inline void count(struct counters *c, struct __sk_buff *skb)
{
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
}

#define OVER_CEILING ((__u64)-1)

// "now" is the coarse monotonic clock (the last tick's time, up to one jiffy behind):
// bpf_ktime_get_ns cost more than the counting and the reservation together (~40 ns a packet
// against ~7 under BPF_PROG_TEST_RUN here, where reading the TSC is slow). Precision is not
// lost where it matters: while the interface is backlogged `next` is ahead of now and
// advances by exact packet times, whatever the clock's resolution; only a packet after an
// idle spell starts its slot up to one tick early (a burst of at most one tick at the rate),
// and the policer's 20 ms burst dwarfs a tick.

// Reserves the packet's time at the rate: returns its departure time (>= now), or
// OVER_CEILING when that would be more than horizon_ns away (nothing reserved then).
//
// Every CPU that sends on the interface updates `next`, so the reservation is a
// compare-and-swap: a CPU that lost the race reads the winner's value and tries again, and the
// packets of all CPUs get disjoint slots, whose sum never exceeds the rate (a plain
// read-then-write would let two CPUs take the same slot). After four lost rounds (four other
// CPUs reserved meanwhile) it takes the next slot with an atomic add, which cannot fail:
// the packet is never dropped for contention, and the time stays accounted.
static __always_inline __u64 reserve(struct ceiling *c, __u64 now, __u32 len)
{
	__u64 cost = ((__u64)len * c->scaled_ns_per_byte) >> SCALE_SHIFT;
	__u64 horizon = c->horizon_ns;
	__u64 old, at;

#pragma unroll
	for (int i = 0; i < 4; i++) {
		old = *(volatile __u64 *)&c->next;
		at = old > now ? old : now;
		if (at - now > horizon)
			return OVER_CEILING;
		if (__sync_val_compare_and_swap(&c->next, old, at + cost) == old)
			return at;
	}
	old = __sync_fetch_and_add(&c->next, cost);
	return old > now ? old : now;
}

// aya 0.14 knows tc programs only by the section name "classifier".
SEC("classifier")
int netclaim_rx(struct __sk_buff *skb)
{
	__u32 slot = SLOT_RX;
	struct counters *c = bpf_map_lookup_elem(&COUNTERS, &slot);
	struct ceiling *limit;

	if (!c)
		return TC_ACT_UNSPEC;
	count(c, skb);
	limit = bpf_map_lookup_elem(&CEILINGS, &slot);
	if (!limit || !limit->scaled_ns_per_byte)
		return TC_ACT_UNSPEC;
	// Ingress policing as a virtual-time token bucket (GCRA): `next` is when the bucket
	// would be empty again; a packet conforms while that is at most horizon_ns away.
	if (reserve(limit, bpf_ktime_get_coarse_ns(), skb->len) == OVER_CEILING) {
		c->ceiling_drops += 1;
		return TC_ACT_SHOT;
	}
	return TC_ACT_UNSPEC;
}

SEC("classifier")
int netclaim_tx(struct __sk_buff *skb)
{
	__u32 slot = SLOT_TX;
	struct counters *c = bpf_map_lookup_elem(&COUNTERS, &slot);
	struct ceiling *limit;
	__u64 now, at;

	if (!c)
		return TC_ACT_UNSPEC;
	count(c, skb);
	limit = bpf_map_lookup_elem(&CEILINGS, &slot);
	if (!limit || !limit->scaled_ns_per_byte)
		return TC_ACT_UNSPEC;
	now = bpf_ktime_get_coarse_ns();
	at = reserve(limit, now, skb->len);
	if (at == OVER_CEILING) {
		c->ceiling_drops += 1;
		return TC_ACT_SHOT;
	}
	// A stamp already later (the sender's own SO_TXTIME, or TCP's pacing) is kept.
	if (at > skb->tstamp) {
		if (at > now)
			c->delayed += 1;
		skb->tstamp = at;
	}
	return TC_ACT_UNSPEC;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
