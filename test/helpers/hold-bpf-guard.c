/*
 * svctrace-hold-bpf-guard SECONDS [CPU]: for SECONDS, keeps the calling CPU
 * inside a BPF syscall that holds the kernel's per-CPU BPF guard
 * (bpf_prog_active) most of the time, as a busy node's BPF users do (a
 * batch lookup walks a large, nearly empty hash map with instrumentation
 * disabled, interrupts still on). A kprobe whose program would run on that
 * CPU meanwhile (a timer's retransmission sent at an interrupt's end) has it
 * skipped; Linux >= 6.7 counts the skip in the program's recursion_misses.
 * Used by a kernel test to make the kernel skip svctrace's kprobe programs.
 * Prints the number of batch lookups made.
 */
#define _GNU_SOURCE
#include <bpf/bpf.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char** argv) {
  if (argc < 2 || atof(argv[1]) <= 0) {
    fprintf(stderr, "usage: %s SECONDS [CPU]\n", argv[0]);
    return 2;
  }
  if (argc > 2) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(atoi(argv[2]), &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
      fprintf(stderr, "sched_setaffinity: %s\n", strerror(errno));
      return 1;
    }
  }
  /* 1 Mi buckets, not preallocated: the map costs little until filled. */
  LIBBPF_OPTS(bpf_map_create_opts, opts, .map_flags = BPF_F_NO_PREALLOC);
  int fd = bpf_map_create(BPF_MAP_TYPE_HASH, "svt_hold_guard", 4, 4, 1u << 20, &opts);
  if (fd < 0) {
    fprintf(stderr, "bpf_map_create: %s\n", strerror(errno));
    return 1;
  }
  __u32 key = 12345, value = 1;
  if (bpf_map_update_elem(fd, &key, &value, BPF_ANY) != 0) {
    fprintf(stderr, "bpf_map_update_elem: %s\n", strerror(errno));
    return 1;
  }
  __u32 keys[16], values[16], out_batch;
  unsigned long calls = 0;
  double end = now() + atof(argv[1]);
  while (now() < end) {
    __u32 count = 16;
    /* From the start each time: the walk to the one element is the point. */
    bpf_map_lookup_batch(fd, NULL, &out_batch, keys, values, &count, NULL);
    calls++;
  }
  printf("%lu\n", calls);
  return 0;
}
