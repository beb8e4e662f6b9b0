/**
 * `npm run bench`: every benchmark, each comparing side by side in one run,
 * each printing a table and writing JSON to bench-results/. Not part of the
 * test suite. Flags: --quick (shorter runs), --only NAME[,NAME] (pipeline,
 * datapath, memory, startup).
 */
import { benchPipeline } from './pipeline';
import { benchDatapath } from './datapath';
import { benchMemory } from './memory';
import { benchStartup } from './startup';

const BENCHES = { startup: benchStartup, pipeline: benchPipeline, datapath: benchDatapath, memory: benchMemory } as const;

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) {
    console.error('bench: needs root (it loads BPF programs and builds the lab)');
    process.exit(77);
  }
  const quick = process.argv.includes('--quick');
  const i = process.argv.indexOf('--only');
  const only = i >= 0 ? (process.argv[i + 1] ?? '').split(',') : Object.keys(BENCHES);
  for (const name of only) {
    const fn = BENCHES[name as keyof typeof BENCHES];
    if (!fn) {
      console.error(`bench: unknown benchmark '${name}' (${Object.keys(BENCHES).join(', ')})`);
      process.exit(2);
    }
    await fn({ quick });
  }
}

main().catch((e) => {
  console.error(`bench: ${e instanceof Error ? e.message : String(e)}`);
  process.exit(1);
});
