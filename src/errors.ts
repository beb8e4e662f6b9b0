/**
 * One error type for svctrace's TypeScript layer. Every failure a user can
 * cause or meet carries a stable `code`; the CLI maps codes to exit codes and
 * prints `message` as one line (src/cli/run.ts).
 */
export type SvctraceErrorCode =
  | 'BAD_INPUT' // a flag, address or argument the user gave is wrong
  | 'NOT_PERMITTED' // needs root or CAP_BPF+CAP_NET_ADMIN+CAP_PERFMON
  | 'NETNS_NOT_FOUND' // the named network namespace does not exist
  | 'NETNS_GONE' // every traced network namespace was deleted while tracing
  | 'KERNEL_UNSUPPORTED' // the kernel lacks a feature the core path needs
  | 'BPF_LOAD' // the verifier rejected a program
  | 'BPF_ATTACH' // attaching a program or link failed
  | 'NATIVE_MISSING' // the addon is not built
  | 'LAB' // the built-in lab could not be set up
  | 'STREAM' // a stream connection failed or was closed by the server
  | 'TOOL_MISSING' // a command svctrace reads the node with (nft, iptables-save, ipvsadm) is not installed
  | 'WRITE_FAILED' // a file svctrace writes (a recording) could not be written: disk full, I/O error
  | 'RECORDING_DAMAGED' // a recording read is damaged where the answer asked for lies (export --pcapng: before any packet)
  | 'INTERNAL';

/** Error with a stable code; `cause` keeps the underlying error (errno, op, verifier log). */
export class SvctraceError extends Error {
  readonly code: SvctraceErrorCode;
  readonly errno?: number;
  readonly op?: string;
  readonly detail?: string;

  constructor(
    code: SvctraceErrorCode,
    message: string,
    extra: { errno?: number; op?: string; detail?: string; cause?: unknown } = {},
  ) {
    super(message, extra.cause === undefined ? undefined : { cause: extra.cause });
    this.name = 'SvctraceError';
    this.code = code;
    this.errno = extra.errno;
    this.op = extra.op;
    this.detail = extra.detail;
  }
}

/** Native errors come with { code: 'EPERM', errno, op, log? } (native/errors.cc). */
interface NativeErrorShape {
  message: string;
  code?: string;
  errno?: number;
  op?: string;
  log?: string;
}

function isNativeError(e: unknown): e is Error & NativeErrorShape {
  return e instanceof Error && typeof (e as NativeErrorShape).errno === 'number';
}

/** Turns an error thrown by the addon into a SvctraceError with a code. */
export function fromNativeError(e: unknown): SvctraceError {
  if (e instanceof SvctraceError) return e;
  if (!isNativeError(e)) {
    const msg = e instanceof Error ? e.message : String(e);
    return new SvctraceError('INTERNAL', msg, { cause: e });
  }
  let code: SvctraceErrorCode = 'INTERNAL';
  if (e.code === 'EPERM' || e.code === 'EACCES') code = 'NOT_PERMITTED';
  else if (e.op === 'open netns' && e.code === 'ENOENT') code = 'NETNS_NOT_FOUND';
  else if (e.op === 'setns' && e.code === 'EINVAL') code = 'BAD_INPUT'; // the file given is not a network namespace
  else if (e.op === 'bpf_object__load') code = 'BPF_LOAD';
  else if (e.op?.startsWith('bpf_program__attach')) code = 'BPF_ATTACH';
  if (code === 'BPF_ATTACH' && (e.code === 'EINVAL' || e.code === 'EOPNOTSUPP')) code = 'KERNEL_UNSUPPORTED';
  return new SvctraceError(code, e.message, { errno: e.errno, op: e.op, detail: e.log, cause: e });
}
