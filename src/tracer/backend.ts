/**
 * Which attach strategy observes the packets around NAT. One tracer, three
 * ways in (the flow model, events and outputs are the same):
 *  - netfilter: BPF netfilter links in each traced namespace, next to NAT's
 *    priority (Linux >= 6.4, CONFIG_NETFILTER_BPF_LINK);
 *  - fentry: entry and exit of NAT's own hook functions in the nf_nat
 *    module, filtered by namespace in the kernel (trampolines with module
 *    BTF: the 5.15/6.1 kernels many managed nodes run);
 *  - kprobe: kprobe and kretprobe on the same functions, for kernels
 *    without module BTF (5.10: Amazon Linux 2, Debian bullseye).
 * Pure: the kernel probes are passed in.
 */
import { SvctraceError } from '../errors';

/** In auto's order of preference. */
export const BACKENDS = ['netfilter', 'fentry', 'kprobe'] as const;
export type Backend = (typeof BACKENDS)[number];
export type BackendRequest = 'auto' | Backend;
export const BACKEND_REQUESTS: readonly BackendRequest[] = ['auto', ...BACKENDS];

/** The kernel probes the choice rests on (native probeFeatures()). */
export interface BackendProbes {
  netfilterLink?: { ok: boolean; message?: string };
  natFentry?: { ok: boolean; message?: string };
  natKprobe?: { ok: boolean; message?: string };
}

/** The probe each backend rests on (native probeFeatures() names). */
export const BACKEND_PROBE: Record<Backend, keyof BackendProbes> = {
  netfilter: 'netfilterLink',
  fentry: 'natFentry',
  kprobe: 'natKprobe',
};

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
  kprobe: 'needs CONFIG_KPROBES=y and nf_nat loaded',
};

/** Why auto took this backend over the ones before it. */
const WHY: Record<Backend, string> = {
  netfilter: 'BPF netfilter links work on this kernel',
  fentry: "fentry/fexit on nf_nat's hook functions work",
  kprobe: "kprobe/kretprobe on nf_nat's hook functions work",
};

function probeOf(p: BackendProbes, b: Backend) {
  return p[BACKEND_PROBE[b]];
}

/**
 * auto: the first backend in BACKENDS whose probe passed — netfilter links
 * where the kernel has them (one program per hook and namespace, no
 * per-packet namespace check), else fentry (trampolines are cheaper than
 * kprobes), else kprobe. An explicit request is taken as given when no
 * probe speaks against it.
 */
export function chooseBackend(request: BackendRequest, probes: BackendProbes): BackendChoice {
  if (request !== 'auto') {
    const p = probeOf(probes, request);
    if (p && !p.ok) {
      throw new SvctraceError('KERNEL_UNSUPPORTED', `backend ${request} does not work on this kernel: ${p.message ?? 'probe failed'} (${WHY_NOT[request]})`);
    }
    return { backend: request, reason: `${request}: asked for with --backend` };
  }
  const failed: string[] = [];
  for (const b of BACKENDS) {
    const p = probeOf(probes, b);
    if (p?.ok) {
      const passedOver = failed.length ? `${failed.join(' and ')} ${failed.length > 1 ? 'do' : 'does'} not work here; ` : '';
      return { backend: b, reason: `${b}: ${passedOver}${WHY[b]}` };
    }
    failed.push(`${b} (${p?.message ?? 'not probed'})`);
  }
  const lines = BACKENDS.map((b) => `${b}: ${probeOf(probes, b)?.message ?? 'not probed'} (${WHY_NOT[b]})`);
  throw new SvctraceError('KERNEL_UNSUPPORTED', `no attach backend works on this kernel — ${lines.join('; ')}`);
}
