/** Drop names shared by the flow model, the dashboard and recordings (no Node imports: the dashboard bundles it). */

/**
 * What a drop is called in its flow, the summary and the dashboard: its
 * reason, and where the kernel gives none (UNKNOWN before Linux 5.17,
 * NOT_SPECIFIED after) the function that freed the packet (`location` as
 * formatLocation in kallsyms.ts writes it), "UNKNOWN@nf_hook_slow". An address with no
 * name (hex) adds nothing: it would make each drop site a name of its own.
 */
export function dropName(reason: string, location: string | null | undefined): string {
  if ((reason !== 'UNKNOWN' && reason !== 'NOT_SPECIFIED') || !location || location.startsWith('0x')) return reason;
  const plus = location.indexOf('+');
  // One word (no spaces): it reads inside the summary's "NAME=3 packets", a diagnosis's "(NAME in 3)".
  return `${reason}@${plus > 0 ? location.slice(0, plus) : location}`;
}
