/** The benchmark's WebSocket client, in its own process: counts events, reports progress to the parent. */
import { connect } from '../src/client/node';

const url = process.argv[2]!;
let received = 0;
void connect({ url }, {
  events: (e) => {
    received += e.length;
  },
}).then(() => {
  process.send?.({ ready: true });
  setInterval(() => process.send?.({ received }), 5);
});
