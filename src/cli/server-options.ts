/**
 * The options of a command that serves the stream (`serve`, `relay`): where
 * it listens, the token clients present, TLS, and the browser origins and
 * host names it accepts. One definition, so both commands take the same.
 */
import { Command } from 'commander';
import { SvctraceError } from '../errors';
import { readSmallFile } from '../small-file';
import { DEFAULT_LISTEN, ServeOptions } from '../stream/server';
import { collect, readToken } from './options';

export interface ServerCliOptions {
  listen: string;
  token?: string;
  tokenFile?: string;
  tlsCert?: string;
  tlsKey?: string;
  allowOrigin: string[];
  allowHost: string[];
}

export function readFileOpt(path: string, what: string): Buffer {
  return readSmallFile(path, what);
}

export function addServerOptions(cmd: Command, listen = DEFAULT_LISTEN): Command {
  return cmd
    .option('--listen <host:port>', 'address to listen on (beyond loopback needs a token)', listen)
    .option('--token <token>', 'bearer token clients must present (>= 16 characters)')
    .option('--token-file <path>', 'read the token from the first line of this file')
    .option('--tls-cert <path>', 'serve HTTPS/WSS with this certificate (PEM)')
    .option('--tls-key <path>', 'private key for --tls-cert (PEM)')
    .option('--allow-origin <origin>', 'browser Origin allowed besides the server itself (repeatable)', collect, [])
    .option('--allow-host <name>', 'Host name accepted besides addresses and localhost, e.g. the name clients use (repeatable; guards against DNS rebinding)', collect, []);
}

/** The server's options from the command line; BAD_INPUT for a half-given TLS pair or an unreadable file. */
export function serverOptionsOf(opts: ServerCliOptions): Pick<ServeOptions, 'listen' | 'token' | 'tls' | 'allowOrigins' | 'allowHosts'> {
  const token = readToken(opts);
  if (!!opts.tlsCert !== !!opts.tlsKey) throw new SvctraceError('BAD_INPUT', 'give both --tls-cert and --tls-key');
  const tls = opts.tlsCert && opts.tlsKey ? { cert: readFileOpt(opts.tlsCert, 'certificate'), key: readFileOpt(opts.tlsKey, 'key') } : undefined;
  return { listen: opts.listen, token, tls, allowOrigins: opts.allowOrigin, allowHosts: opts.allowHost };
}
