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

SEC("tp_btf/kfree_skb")
int BPF_PROG(probe_tp_btf, struct sk_buff *skb, void *location, enum skb_drop_reason reason)
{
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

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} probe_ringbuf SEC(".maps");
