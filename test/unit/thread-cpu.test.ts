import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cpuBetween, machineBusyBetween, MAIN_THREAD, NODE_HELPERS, parseProcStat, parseTaskStat, threadRole } from '../../bench/thread-cpu';

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

test('/proc/stat gives the machine busy and total ticks; guest time is not counted twice', () => {
  const text = 'cpu  100 5 50 800 20 3 2 10 7 1\ncpu0 50 2 25 400 10 1 1 5 3 0\nintr 1 2\n';
  assert.deepEqual(parseProcStat(text), { busy: 170, total: 990 });
  assert.equal(parseProcStat('intr 1 2\n'), undefined, 'no cpu line');
  assert.equal(parseProcStat('cpu  1 x 3 4 5'), undefined, 'not numbers');
  assert.equal(machineBusyBetween({ busy: 100, total: 1000 }, { busy: 160, total: 1200 }), 0.3);
  assert.ok(Number.isNaN(machineBusyBetween(undefined, { busy: 1, total: 2 })));
  assert.ok(Number.isNaN(machineBusyBetween({ busy: 1, total: 2 }, { busy: 1, total: 2 })), 'no time passed');
});
