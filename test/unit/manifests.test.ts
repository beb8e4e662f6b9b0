/**
 * deploy/kubernetes/, checked offline: every document against the
 * Kubernetes OpenAPI schema (kubernetes-models' validators), the RBAC it
 * grants, and the references between the pieces (the relay's agents
 * Service, probe ports, the token's mount, the image tag). The flags the
 * image test runs the DaemonSet's pod with are derived here too.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { loadManifests, loadYaml, manifest, podmanRunOf, withFlag } from '../helpers/podman';

type Models = Record<string, new (d: unknown) => { validate(): void }>;
/** kubernetes-models is ESM only: imported, not required. */
const importModels = (group: string) => import(`kubernetes-models/${group}`) as Promise<Models>;

const VERSION = (JSON.parse(fs.readFileSync(path.resolve(__dirname, '..', '..', '..', 'package.json'), 'utf8')) as { version: string }).version;

describe('Kubernetes manifests (deploy/kubernetes)', () => {
  it('every document is valid against the Kubernetes OpenAPI schema', async () => {
    const docs = await loadManifests();
    assert.ok(docs.length >= 10, `only ${docs.length} documents`);
    for (const { file, doc } of docs) {
      const models = await importModels(doc.apiVersion);
      const Model = models[doc.kind];
      assert.ok(Model, `${file}: no schema for ${doc.apiVersion} ${doc.kind}`);
      assert.doesNotThrow(() => new Model(doc).validate(), `${file}: ${doc.kind} ${doc.metadata.name}`);
    }
  });

  it('the schema check does fail: a DaemonSet without containers, a port name too long', async () => {
    const { DaemonSet } = await importModels('apps/v1');
    const ds = structuredClone(await manifest('DaemonSet', 'svctrace-agent'));
    delete ds.spec.template.spec.containers;
    assert.throws(() => new DaemonSet!(ds).validate());
    const { Service } = await importModels('v1');
    const svc = structuredClone(await manifest('Service', 'svctrace-agents'));
    svc.spec.ports[0].port = 'seven';
    assert.throws(() => new Service!(svc).validate());
  });

  it('RBAC: the agents get, list and watch services, pods, nodes and endpointslices; the relay endpointslices in its namespace', async () => {
    const agent = await manifest('ClusterRole', 'svctrace');
    assert.deepEqual(agent.rules, [
      { apiGroups: [''], resources: ['services', 'pods', 'nodes'], verbs: ['get', 'list', 'watch'] },
      { apiGroups: ['discovery.k8s.io'], resources: ['endpointslices'], verbs: ['get', 'list', 'watch'] },
    ]);
    const relay = await manifest('Role', 'svctrace-relay');
    assert.equal(relay.metadata.namespace, 'svctrace');
    assert.deepEqual(relay.rules, [{ apiGroups: ['discovery.k8s.io'], resources: ['endpointslices'], verbs: ['get', 'list', 'watch'] }]);
    const ds = await manifest('DaemonSet', 'svctrace-agent');
    const deploy = await manifest('Deployment', 'svctrace-relay');
    assert.equal(ds.spec.template.spec.serviceAccountName, ((await manifest('ClusterRoleBinding', 'svctrace')).subjects as Array<{ name: string }>)[0]!.name);
    assert.equal(deploy.spec.template.spec.serviceAccountName, ((await manifest('RoleBinding', 'svctrace-relay')).subjects as Array<{ name: string }>)[0]!.name);
  });

  it('the pieces agree: the relay finds the agents by their headless Service and port name; probes, token and image', async () => {
    const ds = await manifest('DaemonSet', 'svctrace-agent');
    const agents = await manifest('Service', 'svctrace-agents');
    const deploy = await manifest('Deployment', 'svctrace-relay');
    const relayArgs: string[] = deploy.spec.template.spec.containers[0].args;
    const [ns, rest] = relayArgs[relayArgs.indexOf('--agents-service') + 1]!.split('/');
    const [name, portName] = rest!.split(':');
    assert.equal(ns, agents.metadata.namespace);
    assert.equal(name, agents.metadata.name);
    assert.equal(agents.spec.clusterIP, 'None', 'headless: one address per agent');
    assert.ok(agents.spec.ports.some((p: { name: string }) => p.name === portName));
    for (const [k, v] of Object.entries(agents.spec.selector as Record<string, string>)) assert.equal(ds.spec.template.metadata.labels[k], v, `selector ${k}`);
    for (const workload of [ds, deploy]) {
      const c = workload.spec.template.spec.containers[0];
      assert.equal(c.image, `localhost/svctrace:${VERSION}`, 'the tag npm run image makes');
      const listen = c.args[c.args.indexOf('--listen') + 1] as string;
      const port = c.ports.find((p: { name: string }) => p.name === c.livenessProbe.httpGet.port);
      assert.ok(port, `${workload.metadata.name}: the probes' port is declared`);
      assert.equal(String(port.containerPort), listen.split(':')[1], `${workload.metadata.name}: the probes reach what --listen opens`);
      assert.equal(c.readinessProbe.httpGet.path, '/healthz');
      for (const flag of ['--token-file', '--agent-token-file']) {
        if (!c.args.includes(flag)) continue;
        const file = c.args[c.args.indexOf(flag) + 1] as string;
        assert.ok(c.volumeMounts.some((m: { mountPath: string }) => path.dirname(file) === m.mountPath), `${flag} ${file} is in a mounted volume`);
      }
    }
    // The PodMonitor scrapes a port the agents declare.
    const [monitor] = await loadYaml(path.resolve(__dirname, '..', '..', '..', 'deploy', 'prometheus', 'podmonitor.yaml'));
    assert.ok(ds.spec.template.spec.containers[0].ports.some((p: { name: string }) => p.name === monitor!.spec.podMetricsEndpoints[0]!.port));
  });

  it('the DaemonSet as podman runs it: host network and PID, uid 0 with five capabilities, read-only root, the memory limit', async () => {
    const ds = await manifest('DaemonSet', 'svctrace-agent');
    const run = podmanRunOf(ds.spec.template, 'svctrace', { secrets: { 'svctrace-token': '/tmp/token-dir' }, fieldRefs: { 'spec.nodeName': 'node-a' } });
    assert.deepEqual(run.flags, [
      '--network', 'host', '--pid', 'host', '--user', '0', '--security-opt', 'no-new-privileges', '--read-only', '--read-only-tmpfs=false',
      '--cap-drop', 'all', '--cap-add', 'CAP_BPF', '--cap-add', 'CAP_PERFMON', '--cap-add', 'CAP_NET_ADMIN', '--cap-add', 'CAP_SYS_ADMIN', '--cap-add', 'CAP_SYS_RESOURCE',
      '--memory', String(384 * 2 ** 20), '--env', 'NODE_NAME=node-a',
      '--volume', '/sys/kernel/btf:/sys/kernel/btf:ro', '--volume', '/run/netns:/run/netns:ro,rslave', '--volume', '/tmp/token-dir:/etc/svctrace:ro',
    ]);
    assert.deepEqual(withFlag(run.args, '--listen', '127.0.0.1:9'), ['serve', '--all-services', '--listen', '127.0.0.1:9', '--token-file', '/etc/svctrace/token']);
    // What has no translation is an error, never dropped.
    assert.throws(() => podmanRunOf({ spec: { ...ds.spec.template.spec, hostIPC: true } }, 'svctrace', { secrets: {}, fieldRefs: {} }), /hostIPC/);
    assert.throws(() => podmanRunOf(ds.spec.template, 'svctrace', { secrets: {}, fieldRefs: { 'spec.nodeName': 'n' } }), /secret svctrace-token/);
  });
});
