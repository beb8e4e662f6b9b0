/**
 * The Kubernetes API path, against a local fake API server (no real one can
 * run here): explain names the pods and finds where the EndpointSlices and
 * the node's kernel rules disagree; trace names services and backend pods.
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { kernelTest, IS_ROOT } from '../helpers/kernel';
import { waitFor } from '../helpers/flows';
import { startFakeApi, serviceObjects, FakeApi } from '../helpers/fake-apiserver';
import { Lab } from '../../src/lab/lab';
import { explain } from '../../src/explain/explain';
import { ended } from '../helpers/child';

const CLI = path.resolve(__dirname, '..', '..', '..', 'bin', 'svctrace.js');

describe('Kubernetes API (kernel, fake API server)', () => {
  let lab: Lab;
  let api: FakeApi | undefined;
  before(async () => {
    if (IS_ROOT) lab = await Lab.up();
  });
  after(async () => {
    await api?.close();
    await lab?.down();
  });

  function objectsFor(readyPods: string[]) {
    const web = serviceObjects({
      namespace: 'default', name: 'web', clusterIP: '10.96.0.100', port: 80, portName: 'http', targetPort: 8080,
      endpoints: lab.pods.map((p) => ({ ip: p.ip, pod: `web-${p.name}`, ready: readyPods.includes(p.name) })),
    });
    return { services: [web.service], endpointSlices: [web.slice] };
  }

  kernelTest('API and rules agree: pods are named, no mismatch', async () => {
    await api?.close();
    api = await startFakeApi(objectsFor(lab.pods.map((p) => p.name)));
    const e = await explain({ target: 'default/web', netns: lab.nodeNetns, kubeconfig: api.kubeconfig });
    assert.ok(api.requests.some((r) => r.startsWith('GET /api/v1/services')), api.requests.join(', '));
    assert.ok(await waitFor(() => api!.requests.some((r) => /endpointslices\?.*watch=(true|1)/.test(r)), 5000), `informers watch: ${api.requests.join(', ')}`);
    assert.equal(e[0]!.api?.length, 3);
    assert.ok(!e[0]!.diagnoses.some((d) => d.code === 'ENDPOINTS_MISMATCH'));
    assert.equal(e[0]!.api!.find((a) => a.ip === lab.pods[0]!.ip)!.pod, 'default/web-pod0');

    // trace: events carry the Service's name and the backend pod.
    const t = spawn(process.execPath, [CLI, 'trace', '--netns', lab.nodeNetns, '--service', '10.96.0.100:80', '--kubeconfig', api.kubeconfig, '-o', 'json', '--duration', '3'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    t.stdout!.on('data', (d) => (out += d));
    t.stderr!.on('data', (d) => (err += d));
    const exited = ended(t);
    assert.ok(await waitFor(() => err.includes('Ctrl-C to stop'), 15_000), err);
    assert.ok((await lab.curl('http://10.96.0.100/')).ok);
    assert.equal(await exited, 0, err);
    const pod = lab.pods.find((p) => p.name === lab.served.at(-1)!.pod)!;
    const events = out.trim().split('\n').map((l) => JSON.parse(l) as { serviceName?: string; backendPod?: string; stage?: string });
    const unnamed = events.filter((e) => e.serviceName !== 'default/web:http');
    assert.deepEqual(unnamed, [], 'every event names the Service');
    assert.ok(events.some((e) => e.stage === 'STAGE_DNAT' && e.backendPod === `default/web-${pod.name}`));
    await api.close();
    api = undefined;
  });

  kernelTest('API and rules disagree: a pod the API says is not ready is still in the rules', async () => {
    await api?.close();
    api = await startFakeApi(objectsFor(['pod0', 'pod1']));
    const e = await explain({ target: 'default/web', netns: lab.nodeNetns, kubeconfig: api.kubeconfig });
    const d = e[0]!.diagnoses.find((x) => x.code === 'ENDPOINTS_MISMATCH');
    assert.ok(d, JSON.stringify(e[0]!.diagnoses));
    assert.match(d.summary, new RegExp(`${lab.pods[2]!.ip.replace(/\./g, '\\.')}:8080`));
    assert.match(d.evidence.join(' '), /web-pod2.*ready=false/);
    await api.close();
    api = undefined;
  });

  kernelTest('no cluster configuration: silent, never an error', async () => {
    const e = await explain({ target: 'default/web', netns: lab.nodeNetns });
    assert.equal(e[0]!.api, undefined);
    assert.ok(!e[0]!.diagnoses.some((x) => x.code === 'ENDPOINTS_MISMATCH'));
  });
});
