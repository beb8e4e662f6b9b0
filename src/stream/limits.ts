/** The streaming server's limits and timings; every one is a guard against a client hurting others. */
export interface StreamLimits {
  /** Largest client frame accepted (clients only send small control messages); up to 4x this is read and answered with an Error (64 clients x 256 KiB at most), beyond it the connection is cut. */
  maxClientMessageBytes: number;
  /** Clients connected at once. */
  maxClients: number;
  /** Entries in one filter list (services, backends, namespaces, kinds). */
  maxFilterEntries: number;
  /** Client messages per second before the client is told off (then closed). */
  maxClientMessagesPerSecond: number;
  /** Above this many bytes in the socket's send buffer, frames wait in the client's queue. */
  highWaterBytes: number;
  /** The client's queue of encoded frames; past it the oldest frames are dropped and counted. */
  maxQueueBytes: number;
  /** A client whose send buffer stays above the high-water mark this long is disconnected. */
  stuckAfterMs: number;
  /** Pending events are sent when this many are waiting, or after flushMs. */
  flushEvents: number;
  flushMs: number;
  /** Status messages (counters) every this many ms. */
  statusEveryMs: number;
  /** Flow updates every this many ms. */
  flowsEveryMs: number;
  /** A client the server closes has this long to read what it was sent (its last Status, the close frame) before its socket is cut. */
  closeGraceMs: number;
}

export const DEFAULT_LIMITS: StreamLimits = {
  maxClientMessageBytes: 64 * 1024,
  maxClients: 64,
  maxFilterEntries: 256,
  maxClientMessagesPerSecond: 200,
  highWaterBytes: 1024 * 1024,
  maxQueueBytes: 8 * 1024 * 1024,
  stuckAfterMs: 15_000,
  flushEvents: 2048,
  flushMs: 10,
  statusEveryMs: 1000,
  flowsEveryMs: 500,
  closeGraceMs: 1000,
};

/** WebSocket close codes svctrace uses (4000-4999 are for applications). */
export const CLOSE = {
  TOO_SLOW: 4008,
  POLICY: 1008,
  TOO_MANY_CLIENTS: 1013,
  TOO_BIG: 1009,
  SHUTDOWN: 1001,
  BAD_DATA: 1007,
} as const;
