/** The stream client in Node: SvctraceClient with the `ws` package's WebSocket. */
import WebSocket from 'ws';
import { ClientHandlers, ClientOptions, SvctraceClient, WebSocketCtor } from './client';

export function connect(opts: ClientOptions, handlers: ClientHandlers = {}): Promise<SvctraceClient> {
  return SvctraceClient.connect({ WebSocket: WebSocket as unknown as WebSocketCtor, ...opts }, handlers);
}

export { SvctraceClient };
