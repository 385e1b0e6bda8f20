/**
 * A TCP pass-through in front of the Firestore emulator, so that the soak can make Firestore
 * writes fail, not only stall. Everyone (the functions, the sweeper, the soak itself) reaches the
 * emulator through it: the local stack is given its address as FIRESTORE_EMULATOR_HOST, which it
 * treats as an emulator that is already running.
 *
 * `cut(ms)` resets every open connection (TCP RST: requests in flight fail with UNAVAILABLE, a
 * commit may or may not have been applied) and resets new ones until the time is up. Stalling
 * (the emulator's JVM stopped) is the other way to hurt it; see faults.ts.
 *
 * `loseAnswers(ports)` makes the connections from those client ports one-way: what the client sends
 * still reaches the emulator (a commit lands), what the emulator answers is thrown away, until
 * `reset()` cuts them. The client never learns whether its commit was applied.
 */
import { connect, createServer, type Server, type Socket } from 'node:net';

export interface FirestoreProxy {
  /** host:port to give as FIRESTORE_EMULATOR_HOST. */
  readonly host: string;
  cut(durationMs: number): void;
  /** Drops the answers on the open connections from these client ports (this machine's side of each); see above. */
  loseAnswers(clientPorts: ReadonlySet<number>): AnswersLost;
  close(): Promise<void>;
}

export interface AnswersLost {
  /** How many connections now lose their answers. */
  readonly connections: number;
  /** Resets those connections (TCP RST both ways). */
  reset(): void;
}

function reset(socket: Socket): void {
  if (socket.destroyed) return;
  // An RST rather than a FIN: the client learns at once that the connection is gone.
  if (typeof socket.resetAndDestroy === 'function') socket.resetAndDestroy();
  else socket.destroy();
}

export async function startFirestoreProxy(target: string): Promise<FirestoreProxy> {
  const [targetHost = '127.0.0.1', targetPort = ''] = target.split(':');
  const open = new Set<Socket>();
  /** Each proxied connection's upstream socket, by its client socket. */
  const upstreamOf = new Map<Socket, Socket>();
  let refusingUntil = 0;
  const server: Server = createServer((client) => {
    if (Date.now() < refusingUntil) {
      client.on('error', () => undefined);
      reset(client);
      return;
    }
    const upstream = connect(Number(targetPort), targetHost);
    open.add(client);
    open.add(upstream);
    upstreamOf.set(client, upstream);
    const end = (): void => {
      upstreamOf.delete(client);
      open.delete(client);
      open.delete(upstream);
      reset(client);
      reset(upstream);
    };
    client.on('error', end);
    upstream.on('error', end);
    client.on('close', end);
    upstream.on('close', end);
    client.pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : 0;
  return {
    host: `127.0.0.1:${port}`,
    cut: (durationMs) => {
      refusingUntil = Date.now() + durationMs;
      for (const socket of [...open]) reset(socket);
      open.clear();
    },
    loseAnswers: (clientPorts) => {
      const hit = [...upstreamOf].filter(([client]) => client.remotePort !== undefined && clientPorts.has(client.remotePort));
      for (const [client, upstream] of hit) {
        upstream.unpipe(client);
        // Read and drop: the emulator's answers (and its flow-control frames) go nowhere.
        upstream.on('data', () => undefined);
      }
      return {
        connections: hit.length,
        reset: () => {
          for (const [client, upstream] of hit) {
            reset(client);
            reset(upstream);
          }
        },
      };
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of [...open]) reset(socket);
        open.clear();
        server.close(() => resolve());
      }),
  };
}
