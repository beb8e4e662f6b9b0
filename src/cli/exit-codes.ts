/** Exit codes of the svctrace CLI, one per error code (src/errors.ts). */
import type { SvctraceErrorCode } from '../errors';

export const EXIT_CODES: Record<SvctraceErrorCode, number> = {
  INTERNAL: 1,
  BAD_INPUT: 2,
  NETNS_NOT_FOUND: 2,
  NOT_PERMITTED: 77, // EX_NOPERM
  KERNEL_UNSUPPORTED: 3,
  BPF_LOAD: 4,
  BPF_ATTACH: 4,
  NATIVE_MISSING: 5,
  LAB: 6,
  STREAM: 7,
  NETNS_GONE: 8,
  TOOL_MISSING: 9,
  WRITE_FAILED: 10,
  RECORDING_DAMAGED: 1, // README: the answer is no (as replay/export on a damaged recording)
};
