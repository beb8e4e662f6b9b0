/**
 * svctrace's own memory, watched while it runs: an incident tool must show
 * that it stays inside its bounds (the V8 heap limit set on the installed
 * command's #! line), not just claim it. Sampled once a second; the peak
 * goes into the summary and /metrics.
 */
import v8 from 'node:v8';

export interface MemoryPeak {
  heapUsedBytes: number;
  heapLimitBytes: number;
  rssBytes: number;
}

export class MemoryWatch {
  private readonly timer: NodeJS.Timeout;
  readonly peak: MemoryPeak = { heapUsedBytes: 0, heapLimitBytes: v8.getHeapStatistics().heap_size_limit, rssBytes: 0 };

  constructor(everyMs = 1000) {
    this.sample();
    this.timer = setInterval(() => this.sample(), everyMs);
    this.timer.unref();
  }

  sample(): MemoryPeak {
    const h = v8.getHeapStatistics();
    const rss = process.memoryUsage.rss();
    if (h.used_heap_size > this.peak.heapUsedBytes) this.peak.heapUsedBytes = h.used_heap_size;
    if (rss > this.peak.rssBytes) this.peak.rssBytes = rss;
    return { heapUsedBytes: h.used_heap_size, heapLimitBytes: h.heap_size_limit, rssBytes: rss };
  }

  stop(): void {
    clearInterval(this.timer);
  }

  /** "memory: V8 heap peak 80 MiB of a 304 MiB limit, RSS peak 310 MiB" */
  describe(): string {
    const mib = (n: number) => (n / 2 ** 20).toFixed(0);
    return `memory: V8 heap peak ${mib(this.peak.heapUsedBytes)} MiB of a ${mib(this.peak.heapLimitBytes)} MiB limit, RSS peak ${mib(this.peak.rssBytes)} MiB`;
  }
}
