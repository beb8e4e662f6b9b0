/**
 * A pipeline of the checkout at argv[2], tracing argv[4] in network
 * namespace argv[3] with no sinks, in a process of its own: what
 * bench/datapath-compare.ts runs for each tree, so that each has its own
 * heap, JIT and addon. Says 'ready' over IPC once tracing; stops on SIGTERM.
 */
import path from 'node:path';
import type { Pipeline as PipelineClass } from '../src/pipeline/pipeline';
import type { parseServiceSpec as ParseServiceSpec } from '../src/net/ipv4';

async function main(): Promise<void> {
  const [root, netns, service] = process.argv.slice(2);
  if (!root || !netns || !service || !process.send) throw new Error('usage: (forked) trace-child.js CHECKOUT NETNS SERVICE');
  const { Pipeline } = require(path.join(root, 'dist/src/pipeline/pipeline.js')) as { Pipeline: typeof PipelineClass };
  const { parseServiceSpec } = require(path.join(root, 'dist/src/net/ipv4.js')) as { parseServiceSpec: typeof ParseServiceSpec };
  const p = await Pipeline.start({ services: [parseServiceSpec(service)], netns: [netns], kubeconfig: false });
  process.once('SIGTERM', () => {
    p.stop().then(
      () => process.exit(0),
      () => process.exit(1),
    );
  });
  process.send('ready');
}

main().catch((e) => {
  process.stderr.write(`trace-child: ${e instanceof Error ? e.message : String(e)}\n`);
  process.exit(1);
});
