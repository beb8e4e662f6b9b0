// The physical limit of the event pipeline on this machine: a plain C
// consumer of svctrace's ring buffer, fed by the same benchmark source as the
// Node pipeline (bench/pipeline.ts), measured the same way: emit a burst that
// fits the ring, drain it, repeat. Prints one JSON object.
//
// usage: svctrace-ringbuf-baseline TOTAL BURST FLOWS
#include <linux/types.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "events.h"
#include "svctrace.skel.h"

static unsigned long long consumed;

static int on_sample(void *ctx, void *data, size_t size)
{
	const struct svt_event *e = data;

	if (size >= sizeof(*e) && e->size == sizeof(*e))
		consumed++;
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	unsigned long long total = argc > 1 ? strtoull(argv[1], NULL, 10) : 2000000;
	unsigned burst = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 16384;
	unsigned flows = argc > 3 ? (unsigned)strtoul(argv[3], NULL, 10) : 1000;
	struct svctrace_bpf *skel;
	struct ring_buffer *rb;
	unsigned long long emitted = 0;
	int err;

	skel = svctrace_bpf__open();
	if (!skel) {
		fprintf(stderr, "open: %s\n", strerror(errno));
		return 1;
	}
	/* Only the benchmark event source: the baseline attaches nothing, and
	 * the tracer's other programs need kernel features (netfilter links,
	 * fentry) that one kernel or another lacks. */
	struct bpf_program *prog;
	bpf_object__for_each_program(prog, skel->obj)
		bpf_program__set_autoload(prog, prog == skel->progs.svt_bench_emit);
	err = svctrace_bpf__load(skel);
	if (err) {
		fprintf(stderr, "load: %s\n", strerror(-err));
		return 1;
	}
	rb = ring_buffer__new(bpf_map__fd(skel->maps.svt_events), on_sample, NULL, NULL);
	if (!rb) {
		fprintf(stderr, "ring_buffer__new: %s\n", strerror(errno));
		return 1;
	}
	skel->bss->bench_flows = flows;
	double t0 = now_s();
	while (emitted < total) {
		LIBBPF_OPTS(bpf_test_run_opts, opts);
		unsigned n = total - emitted < burst ? (unsigned)(total - emitted) : burst;

		skel->bss->bench_count = n;
		if (bpf_prog_test_run_opts(bpf_program__fd(skel->progs.svt_bench_emit), &opts)) {
			fprintf(stderr, "test_run: %s\n", strerror(errno));
			return 1;
		}
		emitted += n;
		while (consumed < emitted)
			ring_buffer__consume(rb);
	}
	double secs = now_s() - t0;
	__u64 lost = 0, v[1024] = { 0 };
	__u32 idx = SVT_CNT_RINGBUF_LOST;
	int ncpu = libbpf_num_possible_cpus();
	if (ncpu > 0 && ncpu <= 1024 &&
	    bpf_map__lookup_elem(skel->maps.svt_counters, &idx, sizeof(idx), v, sizeof(__u64) * ncpu, 0) == 0)
		for (int i = 0; i < ncpu; i++)
			lost += v[i];
	printf("{\"events\":%llu,\"seconds\":%.6f,\"eventsPerSecond\":%.0f,\"lost\":%llu}\n", consumed, secs, consumed / secs,
	       (unsigned long long)lost);
	ring_buffer__free(rb);
	svctrace_bpf__destroy(skel);
	return 0;
}
