/**
 * The kernel's own account of each conntrack entry, read apart from
 * svctrace: `conntrack -E -e DESTROY -o extended` in a lab namespace.
 */
import assert from 'node:assert/strict';
import { ChildProcess, spawn } from 'node:child_process';
import { runIn } from '../../src/lab/exec';
import { LAB_ADDR } from '../../src/lab/lab';
import { argvInNetns } from '../../src/netns/netns';
import { TIME_SCALE } from './flows';

export interface ConntrackDestroys {
  /** Everything conntrack -E printed so far (one DESTROY line per entry). */
  text(): string;
  stop(): void;
}

/**
 * A table entry only (no packet is sent): UDP between the lab's node and
 * client addresses, on the discard port, which no test's traffic uses.
 */
const MARKER = ['-p', 'udp', '-s', LAB_ADDR.clientIP, '-d', LAB_ADDR.nodeIP, '--sport', '9', '--dport', '9'];

/**
 * Starts listening and resolves once the listener is subscribed: a marker
 * entry is created and deleted until its DESTROY line comes. (A fixed
 * 300 ms pause was too short for a guest under TCG on a busy machine: the
 * first connection's end went by before conntrack -E had joined its
 * netlink group.)
 */
export async function conntrackDestroys(netns: string): Promise<ConntrackDestroys> {
  const [cmd, ...args] = argvInNetns(netns, ['conntrack', '-E', '-e', 'DESTROY', '-o', 'extended']);
  const ct: ChildProcess = spawn(cmd!, args, { stdio: ['ignore', 'pipe', 'ignore'] });
  let out = '';
  ct.stdout!.on('data', (d) => (out += d));
  const marked = () => out.includes(`src=${LAB_ADDR.clientIP} dst=${LAB_ADDR.nodeIP} sport=9 dport=9`);
  const deadline = Date.now() + 10_000 * TIME_SCALE;
  while (!marked() && ct.exitCode === null && Date.now() < deadline) {
    await runIn(netns, ['conntrack', '-I', ...MARKER, '-t', '30'], { allowFail: true });
    await runIn(netns, ['conntrack', '-D', ...MARKER], { allowFail: true });
    const until = Date.now() + 500;
    while (!marked() && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
  }
  if (!marked()) ct.kill();
  assert.ok(marked(), `conntrack -E in ${netns} never reported its marker entry's DESTROY (exit ${ct.exitCode}): ${out}`);
  return { text: () => out, stop: () => void ct.kill() };
}
