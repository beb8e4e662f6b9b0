/**
 * Signing a recording: the hash chain alone proves that a file is
 * consistent, not who wrote it (anyone who edits a chunk can recompute every
 * hash after it). With an Ed25519 key, the recorder signs the chain head
 * (the hash of the last chunk before the trailer, which covers every chunk
 * before it) and puts the signature in the trailer; `verify --pubkey` checks
 * it against the key the reviewer trusts. docs/recording-format.md has the
 * threat model.
 */
import crypto from 'node:crypto';
import { SvctraceError } from '../errors';
import { readSmallFile } from '../small-file';

/** Domain separation: a signature over a recording can be nothing else. */
const DOMAIN = Buffer.from('svctrace recording v1 chain head\n');

function readKey(path: string, what: 'private' | 'public'): crypto.KeyObject {
  const pem = readSmallFile(path, `the ${what} key`);
  let key: crypto.KeyObject;
  try {
    key = what === 'private' ? crypto.createPrivateKey(pem) : crypto.createPublicKey(pem);
  } catch (e) {
    throw new SvctraceError('BAD_INPUT', `${path} is not a PEM ${what} key: ${(e as Error).message}`);
  }
  if (key.asymmetricKeyType !== 'ed25519') throw new SvctraceError('BAD_INPUT', `${path} is a ${key.asymmetricKeyType} key; recordings are signed with Ed25519 (openssl genpkey -algorithm ed25519)`);
  return key;
}

export const readSigningKey = (path: string) => readKey(path, 'private');
export const readVerifyKey = (path: string) => readKey(path, 'public');

/** A short, stable name for a public key: the first 16 hex digits of SHA-256 of its DER form. */
export function keyId(key: crypto.KeyObject): string {
  const pub = key.type === 'private' ? crypto.createPublicKey(key) : key;
  return crypto.createHash('sha256').update(pub.export({ type: 'spki', format: 'der' })).digest('hex').slice(0, 16);
}

export function signChainHead(head: Buffer, key: crypto.KeyObject): Buffer {
  return crypto.sign(null, Buffer.concat([DOMAIN, head]), key);
}

export function chainHeadSignatureOk(head: Buffer, signature: Uint8Array, key: crypto.KeyObject): boolean {
  try {
    return crypto.verify(null, Buffer.concat([DOMAIN, head]), key, signature);
  } catch {
    return false;
  }
}
