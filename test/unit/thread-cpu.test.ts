import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cpuBetween, MAIN_THREAD, NODE_HELPERS, parseTaskStat, threadRole } from '../../bench/thread-cpu';

test('a task stat line gives its name and user + system ticks, even when the name holds spaces and parentheses', () => {
  const line = '4242 (svt-ct (x) y) S 1 4242 4242 0 -1 4194560 120 0 0 0 731 269 0 0 20 0 9 0 1234 0 0';
  assert.deepEqual(parseTaskStat(line), { name: 'svt-ct (x) y', ticks: 1000 });
  assert.equal(parseTaskStat('no name here'), undefined);
  assert.equal(parseTaskStat('1 (x) S 1'), undefined, 'too short: no CPU fields');
});

test('threads are shown as the main thread, the addon threads by name, or the node helpers', () => {
  assert.equal(threadRole(10, 10, 'node'), MAIN_THREAD);
  assert.equal(threadRole(11, 10, 'svt-ring'), 'svt-ring');
  assert.equal(threadRole(12, 10, 'node'), NODE_HELPERS);
});

test('CPU between readings is summed per role; a thread born in between counts from zero', () => {
  const a = new Map([[1, { role: MAIN_THREAD, seconds: 2 }], [2, { role: NODE_HELPERS, seconds: 1 }]]);
  const b = new Map([[1, { role: MAIN_THREAD, seconds: 3.5 }], [2, { role: NODE_HELPERS, seconds: 1.25 }], [3, { role: NODE_HELPERS, seconds: 0.5 }]]);
  const d = cpuBetween(a, b);
  assert.equal(d.get(MAIN_THREAD), 1.5);
  assert.equal(d.get(NODE_HELPERS), 0.75);
});
