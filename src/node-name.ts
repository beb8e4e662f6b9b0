/**
 * The one name of the node svctrace runs on, carried by every Hello,
 * recording header and metric: NODE_NAME when set (a DaemonSet sets it from
 * spec.nodeName through the downward API: the name Kubernetes knows the node
 * by, which the host name need not be), else the host name.
 */
import os from 'node:os';

export function nodeName(env: NodeJS.ProcessEnv = process.env): string {
  const fromEnv = env.NODE_NAME?.trim();
  return fromEnv || os.hostname();
}
