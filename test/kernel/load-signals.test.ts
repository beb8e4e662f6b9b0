/**
 * Loading the programs while the process is showered with signals. The
 * verifier gives up with EAGAIN when a signal is pending for the loading
 * thread, and libbpf tries a program only a few times: under a CPU
 * profiler (SIGPROF every millisecond), `bpf_object__load` failed every
 * time. The addon holds the loading thread's signals while it loads.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { kernelTest, sleep, testBackend } from '../helpers/kernel';
import { loadBinding } from '../../src/native/binding';

kernelTest('the programs load while signals keep arriving (a pending signal makes the verifier give up)', async () => {
  // The fentry and kprobe backends attach to nf_nat's functions: on a node
  // kube-proxy's rules have loaded it; this test makes no lab, so load it.
  spawnSync('modprobe', ['nf_nat'], { stdio: 'ignore' });
  let received = 0;
  const onSignal = () => void received++;
  process.on('SIGUSR2', onSignal);
  // A shell busy-sending SIGUSR2 to this process: far more often than a program takes to verify.
  const sender = spawn('sh', ['-c', 'while kill -USR2 "$1" 2>/dev/null; do :; done', 'sh', String(process.pid)], { stdio: 'ignore' });
  try {
    for (let i = 0; i < 100 && received < 50; i++) await sleep(20);
    assert.ok(received >= 50, `the signal sender is running (${received} signals seen)`);
    const Tracer = loadBinding().Tracer;
    for (let round = 0; round < 3; round++) {
      const before = received;
      const tracer = new Tracer({ backend: testBackend(), benchSource: true });
      try {
        tracer.load();
      } finally {
        tracer.close();
      }
      await sleep(20);
      assert.ok(received > before, `signals kept arriving during load ${round + 1}, and were delivered after it`);
    }
  } finally {
    sender.kill('SIGKILL');
    await new Promise((r) => (sender.exitCode !== null || sender.signalCode !== null ? r(undefined) : sender.once('exit', r)));
    process.off('SIGUSR2', onSignal);
  }
});
