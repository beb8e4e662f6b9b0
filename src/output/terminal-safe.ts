/**
 * Text from outside this process (a recording, a remote server's stream)
 * shown on a terminal: control characters other than newline and tab come
 * out as visible escapes (`\x1b`), so a crafted field cannot move the
 * cursor, recolour, retitle or clear the terminal of whoever inspects the
 * evidence. Pure; JSON output needs none of this (JSON escapes them).
 */
// C0 controls but \t and \n, DEL, and the C1 range (8-bit CSI among them).
const HAS_CONTROL = /[\x00-\x08\x0b-\x1f\x7f-\x9f]/;
const CONTROLS = /[\x00-\x08\x0b-\x1f\x7f-\x9f]/g;
// The same and \n: a one-line record (an event's line) stays one line.
const HAS_CONTROL_OR_NL = /[\x00-\x08\x0a-\x1f\x7f-\x9f]/;
const CONTROLS_OR_NL = /[\x00-\x08\x0a-\x1f\x7f-\x9f]/g;

const escape = (c: string): string => `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`;

/** Multi-line text: newlines kept. */
export function terminalSafe(text: string): string {
  return HAS_CONTROL.test(text) ? text.replace(CONTROLS, escape) : text;
}

/** One line of output per record: a newline inside it is escaped too, so that no field can forge a line. */
export function terminalSafeLine(line: string): string {
  return HAS_CONTROL_OR_NL.test(line) ? line.replace(CONTROLS_OR_NL, escape) : line;
}
