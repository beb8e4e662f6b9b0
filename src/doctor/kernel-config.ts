/** Reads the running kernel's build configuration (/proc/config.gz or /boot/config-*). */
import fs from 'node:fs';
import os from 'node:os';
import zlib from 'node:zlib';

/** CONFIG_X -> 'y' | 'm' | value; null when the config cannot be found. */
export function readKernelConfig(): Map<string, string> | null {
  let text: string | null = null;
  try {
    text = zlib.gunzipSync(fs.readFileSync('/proc/config.gz')).toString('utf8');
  } catch {
    try {
      text = fs.readFileSync(`/boot/config-${os.release()}`, 'utf8');
    } catch {
      return null;
    }
  }
  const out = new Map<string, string>();
  for (const line of text.split('\n')) {
    const m = /^(CONFIG_[A-Z0-9_]+)=(.*)$/.exec(line);
    if (m) out.set(m[1]!, m[2]!);
  }
  return out;
}
