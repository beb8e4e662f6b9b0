/** The stream hub (`serve`): events to every WebSocket client; closing it closes the server. */
import type { StreamServer } from '../../stream/server';
import type { Sink } from '../sink';

export function streamSink(server: StreamServer): Sink {
  return {
    name: 'stream',
    write: (items) => server.publishItems(items),
    close: () => server.close(),
  };
}
