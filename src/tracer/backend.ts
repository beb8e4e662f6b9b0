/**
 * Which attach strategy observes the packets around NAT. One tracer, two
 * ways in (the flow model, events and outputs are the same):
 *  - netfilter: BPF netfilter links in each traced namespace, next to NAT's
 *    priority (Linux >= 6.4, CONFIG_NETFILTER_BPF_LINK);
 *  - fentry: entry and exit of NAT's own hook functions in the nf_nat
 *    module, filtered by namespace in the kernel (trampolines with module
 *    BTF: the 5.x/6.1 kernels most managed nodes run).
 * Pure: the kernel probes are passed in.
 */
import { SvctraceError } from '../errors';

export const BACKENDS = ['netfilter', 'fentry'] as const;
export type Backend = (typeof BACKENDS)[number];
export type BackendRequest = 'auto' | Backend;
export const BACKEND_REQUESTS: readonly BackendRequest[] = ['auto', ...BACKENDS];

/** The kernel probes the choice rests on (native probeFeatures()). */
export interface BackendProbes {
  netfilterLink?: { ok: boolean; message?: string };
  natFentry?: { ok: boolean; message?: string };
}

export interface BackendChoice {
  backend: Backend;
  /** One line: why this one (shown by trace, doctor, Hello and recordings). */
  reason: string;
}

export function parseBackend(s: string): BackendRequest {
  if ((BACKEND_REQUESTS as readonly string[]).includes(s)) return s as BackendRequest;
  throw new SvctraceError('BAD_INPUT', `--backend must be one of ${BACKEND_REQUESTS.join(', ')} (got '${s}')`);
}

/** What a tracer opened without an explicit backend uses: $SVCTRACE_BACKEND, else auto. */
export function defaultBackend(): BackendRequest {
  const env = process.env.SVCTRACE_BACKEND;
  if (!env) return 'auto';
  try {
    return parseBackend(env);
  } catch {
    throw new SvctraceError('BAD_INPUT', `SVCTRACE_BACKEND must be one of ${BACKEND_REQUESTS.join(', ')} (got '${env}')`);
  }
}

const WHY_NOT: Record<Backend, string> = {
  netfilter: 'needs Linux >= 6.4 with CONFIG_NETFILTER_BPF_LINK=y',
  fentry: 'needs BPF trampolines, module BTF (CONFIG_DEBUG_INFO_BTF_MODULES=y) and nf_nat loaded',
};

function probeOf(p: BackendProbes, b: Backend) {
  return b === 'netfilter' ? p.netfilterLink : p.natFentry;
}

/**
 * auto: netfilter links where the kernel has them (one program per hook and
 * namespace, no per-packet namespace check), else fentry. An explicit
 * request is taken as given when no probe speaks against it.
 */
export function chooseBackend(request: BackendRequest, probes: BackendProbes): BackendChoice {
  if (request !== 'auto') {
    const p = probeOf(probes, request);
    if (p && !p.ok) {
      throw new SvctraceError('KERNEL_UNSUPPORTED', `backend ${request} does not work on this kernel: ${p.message ?? 'probe failed'} (${WHY_NOT[request]})`);
    }
    return { backend: request, reason: `${request}: asked for with --backend` };
  }
  if (probes.netfilterLink?.ok) return { backend: 'netfilter', reason: 'netfilter: BPF netfilter links work on this kernel' };
  if (probes.natFentry?.ok) {
    return {
      backend: 'fentry',
      reason: `fentry: no netfilter links here (${probes.netfilterLink?.message ?? 'probe failed'}); fentry/fexit on nf_nat's hook functions work`,
    };
  }
  const lines = BACKENDS.map((b) => `${b}: ${probeOf(probes, b)?.message ?? 'not probed'} (${WHY_NOT[b]})`);
  throw new SvctraceError('KERNEL_UNSUPPORTED', `no attach backend works on this kernel — ${lines.join('; ')}`);
}
