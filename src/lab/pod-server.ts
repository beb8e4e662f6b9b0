/**
 * The lab's pod: an HTTP server (and a UDP echo server) run inside a pod
 * network namespace by src/lab/lab.ts. Each request it serves is logged as a
 * JSON line on stdout: the ground truth tests compare traced flows with.
 * It exits when its stdin closes, so a crashed parent never leaves it behind.
 *
 * argv: --name NAME --port PORT [--udp-port PORT] [--no-request-log]
 * (--no-request-log: serve without logging requests, for benchmarks)
 */
import http from 'node:http';
import dgram from 'node:dgram';

function arg(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

const name = arg('name') ?? 'pod';
const port = Number(arg('port') ?? 8080);
const udpPort = arg('udp-port') ? Number(arg('udp-port')) : null;
const requestLog = !process.argv.includes('--no-request-log');

function log(obj: Record<string, unknown>): void {
  process.stdout.write(JSON.stringify({ pod: name, ...obj }) + '\n');
}

const server = http.createServer((req, res) => {
  const client = `${req.socket.remoteAddress}:${req.socket.remotePort}`;
  if (requestLog) log({ event: 'request', proto: 'tcp', client, path: req.url });
  res.setHeader('content-type', 'text/plain');
  // /big: an answer of several full-size packets (what a path MTU problem loses).
  res.end(`pod=${name} client=${client}\n${req.url === '/big' ? `${'x'.repeat(8000)}\n` : ''}`);
});
server.keepAliveTimeout = 1000;

let pending = udpPort === null ? 1 : 2;
function ready(): void {
  if (--pending === 0) log({ event: 'ready', port, udpPort });
}
server.listen(port, '0.0.0.0', ready);

if (udpPort !== null) {
  const sock = dgram.createSocket('udp4');
  sock.on('message', (msg, rinfo) => {
    const client = `${rinfo.address}:${rinfo.port}`;
    if (requestLog) log({ event: 'request', proto: 'udp', client });
    sock.send(`pod=${name} client=${client}\n`, rinfo.port, rinfo.address);
  });
  sock.bind(udpPort, '0.0.0.0', ready);
}

process.stdin.on('end', () => process.exit(0));
process.stdin.on('error', () => process.exit(0));
process.stdin.resume();
