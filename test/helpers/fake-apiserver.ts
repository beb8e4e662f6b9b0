/**
 * A local stand-in for the Kubernetes API server (no real one can run on
 * these machines): serves Services and EndpointSlices with list and watch,
 * over plain HTTP on loopback, plus a kubeconfig pointing at it.
 */
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';

export interface FakeApi {
  url: string;
  kubeconfig: string;
  requests: string[];
  close(): Promise<void>;
}

export async function startFakeApi(objects: { services: object[]; endpointSlices: object[] }): Promise<FakeApi> {
  const requests: string[] = [];
  const watches = new Set<http.ServerResponse>();
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://x');
    requests.push(`${req.method} ${url.pathname}${url.search}`);
    const watch = url.searchParams.get('watch') === 'true' || url.searchParams.get('watch') === '1';
    const list =
      url.pathname === '/api/v1/services' ? { kind: 'ServiceList', apiVersion: 'v1', items: objects.services }
      : url.pathname === '/apis/discovery.k8s.io/v1/endpointslices' ? { kind: 'EndpointSliceList', apiVersion: 'discovery.k8s.io/v1', items: objects.endpointSlices }
      : null;
    if (!list) {
      res.writeHead(404, { 'content-type': 'application/json' }).end(JSON.stringify({ kind: 'Status', status: 'Failure', code: 404 }));
      return;
    }
    if (watch) {
      // Nothing changes: keep the watch open until the test ends.
      res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
      res.flushHeaders();
      watches.add(res);
      res.on('close', () => watches.delete(res));
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ ...list, metadata: { resourceVersion: '1' } }));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const port = (server.address() as { port: number }).port;
  const url = `http://127.0.0.1:${port}`;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'svt-kube-'));
  const kubeconfig = path.join(dir, 'config');
  fs.writeFileSync(
    kubeconfig,
    `apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: ${url}
    insecure-skip-tls-verify: true
users:
- name: fake
  user:
    token: fake-token
contexts:
- name: fake
  context:
    cluster: fake
    user: fake
current-context: fake
`,
  );
  return {
    url,
    kubeconfig,
    requests,
    close: async () => {
      for (const w of watches) w.end();
      server.closeAllConnections();
      await new Promise((r) => server.close(() => r(undefined)));
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A Service and its EndpointSlice in the API's JSON shape. */
export function serviceObjects(s: { namespace: string; name: string; clusterIP: string; port: number; portName: string; targetPort: number; endpoints: Array<{ ip: string; pod: string; ready?: boolean; terminating?: boolean }> }) {
  return {
    service: { apiVersion: 'v1', kind: 'Service', metadata: { namespace: s.namespace, name: s.name, resourceVersion: '1' }, spec: { clusterIP: s.clusterIP, ports: [{ name: s.portName, port: s.port, protocol: 'TCP', targetPort: s.targetPort }], sessionAffinity: 'None' } },
    slice: {
      apiVersion: 'discovery.k8s.io/v1',
      kind: 'EndpointSlice',
      metadata: { namespace: s.namespace, name: `${s.name}-abcde`, labels: { 'kubernetes.io/service-name': s.name }, resourceVersion: '1' },
      addressType: 'IPv4',
      ports: [{ name: s.portName, port: s.targetPort, protocol: 'TCP' }],
      endpoints: s.endpoints.map((e) => ({ addresses: [e.ip], conditions: { ready: e.ready !== false, serving: e.ready !== false, terminating: !!e.terminating }, targetRef: { kind: 'Pod', namespace: s.namespace, name: e.pod } })),
    },
  };
}
