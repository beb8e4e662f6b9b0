/**
 * The optional Kubernetes view: Services and EndpointSlices watched through
 * the API (@kubernetes/client-node informers: list, then watch — no
 * polling), when a kubeconfig or an in-cluster service account exists.
 * Without a cluster this stays silent: start() returns null.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export interface ApiEndpoint {
  ip: string;
  port: number;
  ready: boolean;
  terminating: boolean;
  pod?: string; // namespace/name from targetRef
  node?: string;
}

export interface ApiService {
  namespace: string;
  name: string;
  clusterIP: string;
  ports: Array<{ name: string; port: number; proto: string; targetPort?: number | string }>;
  sessionAffinity?: string;
  externalTrafficPolicy?: string;
}

/** Where a kubeconfig would come from, or null: then there is no cluster to ask. */
export function kubeconfigSource(explicit?: string): { kind: 'file'; path: string } | { kind: 'in-cluster' } | null {
  if (explicit) return { kind: 'file', path: explicit };
  const env = process.env.KUBECONFIG?.split(':').find((p) => p && fs.existsSync(p));
  if (env) return { kind: 'file', path: env };
  const home = path.join(os.homedir(), '.kube', 'config');
  if (fs.existsSync(home)) return { kind: 'file', path: home };
  if (process.env.KUBERNETES_SERVICE_HOST && fs.existsSync('/var/run/secrets/kubernetes.io/serviceaccount/token')) return { kind: 'in-cluster' };
  return null;
}

interface K8sObject {
  metadata?: { namespace?: string; name?: string; labels?: Record<string, string> };
}
interface ServiceObject extends K8sObject {
  spec?: { clusterIP?: string; ports?: Array<{ name?: string; port: number; protocol?: string; targetPort?: number | string }>; sessionAffinity?: string; externalTrafficPolicy?: string };
}
interface SliceObject extends K8sObject {
  addressType?: string;
  endpoints?: Array<{ addresses: string[]; conditions?: { ready?: boolean; serving?: boolean; terminating?: boolean }; targetRef?: { kind?: string; namespace?: string; name?: string; uid?: string }; nodeName?: string }>;
  ports?: Array<{ name?: string; port?: number; protocol?: string }>;
}

type Informer = { start(): Promise<void>; stop(): Promise<void> | void; list(): unknown[]; on(ev: string, cb: (...a: unknown[]) => void): void };

export class Cluster {
  private constructor(
    private readonly informers: Informer[],
    private readonly svcInformer: Informer,
    private readonly sliceInformer: Informer,
  ) {}

  /**
   * Connects and waits for the first list (up to `timeoutMs`). Returns null
   * when there is no cluster configuration; a configuration that does not
   * answer is reported through `onWarning`, never thrown.
   */
  static async start(opts: { kubeconfig?: string; timeoutMs?: number; onWarning?: (m: string) => void } = {}): Promise<Cluster | null> {
    const src = kubeconfigSource(opts.kubeconfig);
    if (!src) return null;
    const k8s = await import('@kubernetes/client-node');
    const kc = new k8s.KubeConfig();
    try {
      if (src.kind === 'file') kc.loadFromFile(src.path);
      else kc.loadFromCluster();
    } catch (e) {
      opts.onWarning?.(`kubeconfig ${src.kind === 'file' ? src.path : '(in-cluster)'} unusable: ${(e as Error).message}`);
      return null;
    }
    const core = kc.makeApiClient(k8s.CoreV1Api);
    const disc = kc.makeApiClient(k8s.DiscoveryV1Api);
    const svc = k8s.makeInformer(kc, '/api/v1/services', () => core.listServiceForAllNamespaces()) as unknown as Informer;
    const slices = k8s.makeInformer(kc, '/apis/discovery.k8s.io/v1/endpointslices', () => disc.listEndpointSliceForAllNamespaces()) as unknown as Informer;
    let warned = false;
    let firstError: unknown;
    let stopped = false;
    for (const inf of [svc, slices]) {
      inf.on('error', (err: unknown) => {
        firstError ??= err;
        if (stopped) return;
        if (!warned && ready) opts.onWarning?.(`Kubernetes API: ${(err as Error)?.message ?? String(err)} (names from the API may be stale)`);
        warned = true;
        // Informers stop on error; try again later.
        setTimeout(() => {
          if (!stopped) void inf.start().catch(() => undefined);
        }, 5000).unref();
      });
    }
    let ready = false;
    const started = Promise.all([svc.start(), slices.start()]);
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<'timeout'>((r) => (timer = setTimeout(() => r('timeout'), opts.timeoutMs ?? 5000)));
    let r = await Promise.race([started.then(() => 'ok' as const, (e: unknown) => e), timeout]);
    clearTimeout(timer);
    if (r === 'ok' && firstError) r = firstError; // the first list failed
    if (r !== 'ok') {
      stopped = true;
      opts.onWarning?.(`Kubernetes API did not answer (${r === 'timeout' ? 'timeout' : (r as Error)?.message}); continuing without it`);
      await Promise.allSettled([svc.stop(), slices.stop()]);
      return null;
    }
    ready = true;
    const c = new Cluster([svc, slices], svc, slices);
    c.onStop = () => (stopped = true);
    return c;
  }

  private onStop: () => void = () => undefined;

  services(): ApiService[] {
    return (this.svcInformer.list() as ServiceObject[]).map((s) => ({
      namespace: s.metadata?.namespace ?? '',
      name: s.metadata?.name ?? '',
      clusterIP: s.spec?.clusterIP ?? '',
      ports: (s.spec?.ports ?? []).map((p) => ({ name: p.name ?? '', port: p.port, proto: (p.protocol ?? 'TCP').toLowerCase(), targetPort: p.targetPort })),
      sessionAffinity: s.spec?.sessionAffinity,
      externalTrafficPolicy: s.spec?.externalTrafficPolicy,
    }));
  }

  /** The Service (and port name) at a ClusterIP:port. */
  serviceAt(ip: string, port: number, proto: string): { service: ApiService; portName: string } | undefined {
    for (const s of this.services()) {
      if (s.clusterIP !== ip) continue;
      const p = s.ports.find((x) => x.port === port && x.proto === proto);
      if (p) return { service: s, portName: p.name };
    }
    return undefined;
  }

  /** Endpoints of a Service port, from its EndpointSlices. */
  endpoints(namespace: string, name: string, portName: string): ApiEndpoint[] {
    const out: ApiEndpoint[] = [];
    for (const sl of this.sliceInformer.list() as SliceObject[]) {
      if (sl.metadata?.namespace !== namespace || sl.metadata?.labels?.['kubernetes.io/service-name'] !== name) continue;
      if (sl.addressType && sl.addressType !== 'IPv4') continue;
      const port = (sl.ports ?? []).find((p) => (p.name ?? '') === portName)?.port;
      if (port === undefined) continue;
      for (const ep of sl.endpoints ?? []) {
        for (const ip of ep.addresses) {
          out.push({
            ip,
            port,
            ready: ep.conditions?.ready !== false,
            terminating: !!ep.conditions?.terminating,
            pod: ep.targetRef?.kind === 'Pod' ? `${ep.targetRef.namespace ?? namespace}/${ep.targetRef.name}` : undefined,
            node: ep.nodeName,
          });
        }
      }
    }
    return out;
  }

  /** The pod behind an endpoint address, from any EndpointSlice. */
  podAt(ip: string): string | undefined {
    for (const sl of this.sliceInformer.list() as SliceObject[]) {
      for (const ep of sl.endpoints ?? []) {
        if (ep.addresses.includes(ip) && ep.targetRef?.kind === 'Pod') return `${ep.targetRef.namespace ?? sl.metadata?.namespace}/${ep.targetRef.name}`;
      }
    }
    return undefined;
  }

  /** Stops watching; never waits more than 2 s for the API to let go. */
  /** namespace/name of the pod with this UID, from the EndpointSlices' targetRefs. */
  podByUid(uid: string): string | undefined {
    for (const sl of this.sliceInformer.list() as SliceObject[]) {
      for (const ep of sl.endpoints ?? []) {
        if (ep.targetRef?.uid === uid) return `${ep.targetRef.namespace ?? sl.metadata?.namespace}/${ep.targetRef.name}`;
      }
    }
    return undefined;
  }

  async stop(): Promise<void> {
    this.onStop();
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      Promise.allSettled(this.informers.map((i) => i.stop())),
      new Promise((r) => (timer = setTimeout(r, 2000))),
    ]);
    clearTimeout(timer);
  }
}
