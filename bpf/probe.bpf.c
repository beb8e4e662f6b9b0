// SPDX-License-Identifier: GPL-2.0
/*
 * Tiny programs used only by `svctrace doctor` (native/probe.cc): each one is
 * loaded and attached alone to learn whether this kernel supports the
 * program/attach type, then destroyed. They do nothing when they run.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

SEC("netfilter")
int probe_netfilter(struct bpf_nf_ctx *ctx)
{
	return 1; /* NF_ACCEPT */
}

/* The drop tracepoint as every kernel svctrace runs on has it (5.10's
 * kfree_skb has two arguments: skb, location). */
SEC("tp_btf/kfree_skb")
int BPF_PROG(probe_tp_btf, struct sk_buff *skb)
{
	return 0;
}

/* Reads the drop reason, as svctrace does where it exists: the verifier
 * then checks the tracepoint has it (Linux >= 5.17). */
volatile __u32 probe_sink;

SEC("tp_btf/kfree_skb")
int BPF_PROG(probe_drop_reason, struct sk_buff *skb, void *location, enum skb_drop_reason reason)
{
	probe_sink = reason;
	return 0;
}

SEC("kprobe/nf_conntrack_destroy")
int probe_kprobe(void *ctx)
{
	return 0;
}

SEC("fentry/nf_conntrack_destroy")
int BPF_PROG(probe_fentry)
{
	return 0;
}

/* What the fentry backend needs: a trampoline on a function of the nf_nat
 * module (module BTF), the NAT hook svctrace observes. */
SEC("fentry/nf_nat_ipv4_pre_routing")
int BPF_PROG(probe_nat_fentry)
{
	return 0;
}

/* What the kprobe backend needs: a kprobe on the same NAT hook function. */
SEC("kprobe/nf_nat_ipv4_pre_routing")
int probe_nat_kprobe(void *ctx)
{
	return 0;
}

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} probe_ringbuf SEC(".maps");
