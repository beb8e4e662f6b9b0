/** Serves the bundled dashboard (dist/dashboard) at / — no CDN, everything from svctrace itself. */
import fs from 'node:fs';
import path from 'node:path';
import { pipeline } from 'node:stream';
import type http from 'node:http';

export const DASHBOARD_DIR = path.resolve(__dirname, '..', '..', 'dashboard');

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.map': 'application/json',
};

/** A request handler for GET / and the bundle's files; false when the path is not one of them. */
export function dashboardHandler(dir = DASHBOARD_DIR): (req: http.IncomingMessage, res: http.ServerResponse) => boolean {
  return (req, res) => {
    if (req.method !== 'GET' && req.method !== 'HEAD') return false;
    const url = (req.url ?? '/').split('?')[0]!;
    const name = url === '/' ? 'index.html' : url.slice(1);
    // Only plain file names of the bundle: no traversal, no subdirectories.
    if (!/^[A-Za-z0-9_.-]+$/.test(name) || name.startsWith('.')) return false;
    const file = path.join(dir, name);
    const type = TYPES[path.extname(name)];
    if (!type || !fs.existsSync(file)) {
      if (url === '/') {
        res.writeHead(503, { 'content-type': 'text/plain' }).end("dashboard not built: run 'npm run build'\n");
        return true;
      }
      return false;
    }
    res.writeHead(200, {
      'content-type': type,
      'cache-control': 'no-cache',
      'content-security-policy': "default-src 'self'; connect-src 'self' ws: wss:; style-src 'self' 'unsafe-inline'",
      'x-content-type-options': 'nosniff',
    });
    if (req.method === 'HEAD') res.end();
    // A file gone or unreadable since it was found (a rebuild while serving)
    // ends this response, not the server; a client gone closes the file.
    else pipeline(fs.createReadStream(file), res, () => undefined);
    return true;
  };
}
