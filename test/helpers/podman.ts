/**
 * The manifests under deploy/kubernetes/, read as the tests need them, and a
 * pod template turned into the `podman run` flags that give a container the
 * same privileges: the image test runs what the DaemonSet declares, so the
 * two cannot drift apart. Whatever of the pod spec has no translation here
 * is an error, never silently dropped.
 */
import fs from 'node:fs';
import path from 'node:path';

export const DEPLOY_DIR = path.resolve(__dirname, '..', '..', '..', 'deploy', 'kubernetes');

export interface Manifest {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
  spec?: any; // eslint-disable-line @typescript-eslint/no-explicit-any
  rules?: Array<{ apiGroups: string[]; resources: string[]; verbs: string[] }>;
  [k: string]: unknown;
}

/** The documents of one YAML file (client-node's parser: the one the project already has). */
export async function loadYaml(file: string): Promise<Manifest[]> {
  const { loadAllYaml } = await import('@kubernetes/client-node');
  return loadAllYaml(fs.readFileSync(file, 'utf8')) as Manifest[];
}

/** Every document of every file under deploy/kubernetes/, with the file it came from. */
export async function loadManifests(): Promise<Array<{ file: string; doc: Manifest }>> {
  const files = fs.readdirSync(DEPLOY_DIR).filter((f) => f.endsWith('.yaml')).sort();
  const out: Array<{ file: string; doc: Manifest }> = [];
  for (const file of files) for (const doc of await loadYaml(path.join(DEPLOY_DIR, file))) out.push({ file, doc });
  return out;
}

export async function manifest(kind: string, name: string): Promise<Manifest> {
  const m = (await loadManifests()).find((x) => x.doc.kind === kind && x.doc.metadata.name === name);
  if (!m) throw new Error(`no ${kind} ${name} under ${DEPLOY_DIR}`);
  return m.doc;
}

export interface PodmanRun {
  /** Flags for `podman run`, before the image. */
  flags: string[];
  /** The container's args (after the image). */
  args: string[];
}

/** Kubernetes quantities as podman takes them (bytes for memory). */
function memoryBytes(q: string): number {
  const m = /^(\d+)(Ki|Mi|Gi)?$/.exec(q);
  if (!m) throw new Error(`memory quantity '${q}' not understood`);
  return Number(m[1]) * { '': 1, Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3 }[m[2] ?? '']!;
}

const KNOWN_POD = new Set(['serviceAccountName', 'hostNetwork', 'hostPID', 'dnsPolicy', 'tolerations', 'terminationGracePeriodSeconds', 'containers', 'volumes']);
const KNOWN_CONTAINER = new Set(['name', 'image', 'imagePullPolicy', 'args', 'env', 'ports', 'securityContext', 'resources', 'livenessProbe', 'readinessProbe', 'volumeMounts']);
const KNOWN_SECURITY = new Set(['runAsUser', 'runAsGroup', 'runAsNonRoot', 'privileged', 'allowPrivilegeEscalation', 'readOnlyRootFilesystem', 'capabilities', 'seccompProfile']);

/**
 * `podman run` flags for container `name` of a pod template. Secrets are
 * given as host directories (`secrets[secretName]`), downward-API values as
 * `fieldRefs[fieldPath]`. The machine's own needs (runc, ulimits) are the
 * caller's.
 */
export function podmanRunOf(template: { spec: any }, name: string, given: { secrets: Record<string, string>; fieldRefs: Record<string, string> }): PodmanRun { // eslint-disable-line @typescript-eslint/no-explicit-any
  const pod = template.spec;
  const unknown = Object.keys(pod).filter((k) => !KNOWN_POD.has(k));
  if (unknown.length) throw new Error(`pod spec fields with no podman translation: ${unknown.join(', ')}`);
  const c = (pod.containers as any[]).find((x) => x.name === name); // eslint-disable-line @typescript-eslint/no-explicit-any
  if (!c) throw new Error(`no container ${name}`);
  const unknownC = Object.keys(c).filter((k) => !KNOWN_CONTAINER.has(k));
  if (unknownC.length) throw new Error(`container fields with no podman translation: ${unknownC.join(', ')}`);
  const flags: string[] = [];
  if (pod.hostNetwork) flags.push('--network', 'host');
  if (pod.hostPID) flags.push('--pid', 'host');
  const sc = c.securityContext ?? {};
  const unknownS = Object.keys(sc).filter((k) => !KNOWN_SECURITY.has(k));
  if (unknownS.length) throw new Error(`securityContext fields with no podman translation: ${unknownS.join(', ')}`);
  if (sc.privileged) flags.push('--privileged');
  if (sc.runAsUser !== undefined) flags.push('--user', sc.runAsGroup !== undefined ? `${sc.runAsUser}:${sc.runAsGroup}` : String(sc.runAsUser));
  if (sc.allowPrivilegeEscalation === false) flags.push('--security-opt', 'no-new-privileges');
  // Kubernetes mounts no tmpfs of its own on a read-only root: nor does podman, then.
  if (sc.readOnlyRootFilesystem) flags.push('--read-only', '--read-only-tmpfs=false');
  for (const cap of sc.capabilities?.drop ?? []) flags.push('--cap-drop', cap === 'ALL' ? 'all' : `CAP_${cap}`);
  for (const cap of sc.capabilities?.add ?? []) flags.push('--cap-add', `CAP_${cap}`);
  const seccomp = sc.seccompProfile?.type;
  if (seccomp === 'Unconfined') flags.push('--security-opt', 'seccomp=unconfined');
  else if (seccomp !== undefined && seccomp !== 'RuntimeDefault') throw new Error(`seccompProfile ${seccomp}: no podman translation`);
  const limits = c.resources?.limits ?? {};
  if (limits.memory) flags.push('--memory', String(memoryBytes(limits.memory)));
  if (limits.cpu) flags.push('--cpus', String(limits.cpu).endsWith('m') ? String(parseInt(limits.cpu, 10) / 1000) : String(limits.cpu));
  for (const e of c.env ?? []) {
    if (e.value !== undefined) flags.push('--env', `${e.name}=${e.value}`);
    else if (e.valueFrom?.fieldRef) {
      const v = given.fieldRefs[e.valueFrom.fieldRef.fieldPath];
      if (v === undefined) throw new Error(`env ${e.name}: no value given for fieldRef ${e.valueFrom.fieldRef.fieldPath}`);
      flags.push('--env', `${e.name}=${v}`);
    } else throw new Error(`env ${e.name}: no podman translation`);
  }
  const volumes = new Map<string, any>((pod.volumes ?? []).map((v: any) => [v.name, v])); // eslint-disable-line @typescript-eslint/no-explicit-any
  for (const m of c.volumeMounts ?? []) {
    const v = volumes.get(m.name);
    if (!v) throw new Error(`volumeMount ${m.name}: no such volume`);
    let source: string;
    if (v.hostPath) source = v.hostPath.path;
    else if (v.secret) {
      const dir = given.secrets[v.secret.secretName];
      if (!dir) throw new Error(`volume ${m.name}: no directory given for secret ${v.secret.secretName}`);
      source = dir;
    } else throw new Error(`volume ${m.name}: only hostPath and secret volumes have a podman translation`);
    const opts = [m.readOnly ? 'ro' : 'rw'];
    if (m.mountPropagation === 'HostToContainer') opts.push('rslave');
    else if (m.mountPropagation === 'Bidirectional') opts.push('rshared');
    flags.push('--volume', `${source}:${m.mountPath}:${opts.join(',')}`);
  }
  return { flags, args: [...(c.args ?? [])] };
}

/** args with `--flag value` replaced (the test's own address instead of the node's, say). */
export function withFlag(args: string[], flag: string, value: string): string[] {
  const i = args.indexOf(flag);
  if (i < 0 || i + 1 >= args.length) throw new Error(`${flag} is not among ${args.join(' ')}`);
  return [...args.slice(0, i + 1), value, ...args.slice(i + 2)];
}
