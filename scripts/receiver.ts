/**
 * A small system of record for effects, for the demo and the tests: it honours idempotency keys
 * the way payment and messaging APIs do (the same key gets the same stored result and is applied
 * once; the same key with a different request is refused), records every application, and can be
 * told to misbehave.
 *
 *   POST /effects        { intent }, header Idempotency-Key  -> 201 applied | 200 replay | 422 | 400
 *   GET  /effects/{key}                                       -> 200 the stored result | 404
 *   GET  /applications                                        -> every application, in order
 *   POST /control        { availability?, faults?, clearFaults? }
 *   GET  /health
 *
 * Faults (each for `apply` or `lookup`, for a number of requests, optionally only for one key or
 * one intent kind): `fail-before-apply` (500, nothing applied), `apply-then-hang` (applied, then no
 * answer until the client gives up), `unavailable` (503), `drop-connection` (socket closed, nothing
 * applied). Availability: `up`, `unavailable` (503 for everything), `refused` (not listening).
 *
 * Run it: `npx tsx scripts/receiver.ts [--port 8787]`; it prints its URL.
 */
import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export type FaultMode = 'fail-before-apply' | 'apply-then-hang' | 'unavailable' | 'drop-connection';
export type Availability = 'up' | 'unavailable' | 'refused';

export interface Fault {
  readonly op: 'apply' | 'lookup';
  readonly mode: FaultMode;
  /** How many matching requests it affects; Infinity for all of them. */
  readonly times: number;
  readonly key?: string;
  /** Only requests whose intent has this kind (apply only). */
  readonly kind?: string;
}

export interface Application {
  readonly seq: number;
  readonly key: string;
  readonly kind: string;
  readonly intent: unknown;
  readonly effectId: string;
  readonly appliedAtMs: number;
  readonly fingerprint: string;
}

export interface ReceivedRequest {
  readonly seq: number;
  readonly op: 'apply' | 'lookup';
  readonly key: string;
  readonly kind: string | null;
  /** What the receiver did: a status code, `hung` or `dropped`. */
  outcome: number | 'hung' | 'dropped' | 'pending';
}

export interface ApplyRequestInfo {
  readonly key: string;
  readonly kind: string | null;
  readonly intent: unknown;
}

export interface ReceiverOptions {
  readonly host?: string;
  /** 0 picks a free port. */
  readonly port?: number;
  readonly now?: () => number;
}

/** JSON with sorted object keys: two requests with the same content compare equal. */
function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  if (value !== null && typeof value === 'object') {
    const fields = Object.entries(value as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${fields.map(([name, item]) => `${JSON.stringify(name)}:${canonical(item)}`).join(',')}}`;
  }
  return value === undefined ? 'null' : JSON.stringify(value);
}

const MAX_BODY_BYTES = 64 * 1024;

export class Receiver {
  readonly applications: Application[] = [];
  readonly requests: ReceivedRequest[] = [];
  /** Runs when an apply request arrives, before availability and faults are consulted. */
  beforeApply: ((request: ApplyRequestInfo) => void | Promise<void>) | null = null;
  /** Awaited after an application is recorded and before it is answered (an effect in flight). */
  afterApply: ((application: Application) => void | Promise<void>) | null = null;
  /** The Retry-After header of every 503 (seconds or an HTTP date), so a test can ask for an absurd wait. */
  retryAfter = '1';

  private readonly faults: { fault: Fault; left: number }[] = [];
  private readonly byKey = new Map<string, Application>();
  private availability: Availability = 'up';
  private readonly now: () => number;
  private readonly host: string;
  private port: number;
  private server: Server;
  private stopped = false;

  private constructor(options: ReceiverOptions) {
    this.now = options.now ?? Date.now;
    this.host = options.host ?? '127.0.0.1';
    this.port = options.port ?? 0;
    this.server = this.createServer();
  }

  static async start(options: ReceiverOptions = {}): Promise<Receiver> {
    const receiver = new Receiver(options);
    await receiver.listen();
    return receiver;
  }

  get url(): string {
    return `http://${this.host}:${this.port}`;
  }

  /** Applications, optionally of one intent kind. */
  applied(kind?: string): Application[] {
    return kind === undefined ? [...this.applications] : this.applications.filter((application) => application.kind === kind);
  }

  inject(fault: Fault): void {
    this.faults.push({ fault, left: fault.times });
  }

  clearFaults(): void {
    this.faults.length = 0;
  }

  async setAvailability(availability: Availability): Promise<void> {
    if (availability === this.availability) return;
    const previous = this.availability;
    this.availability = availability;
    if (availability === 'refused') await this.close();
    else if (previous === 'refused') await this.listen();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.availability !== 'refused') await this.close();
  }

  private listen(): Promise<void> {
    if (this.stopped) return Promise.resolve();
    this.server = this.createServer();
    return new Promise((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(this.port, this.host, () => {
        this.server.off('error', reject);
        this.port = (this.server.address() as AddressInfo).port;
        resolve();
      });
    });
  }

  /** Stops listening and drops every connection, hung answers included: clients see their connection refused or reset. */
  private close(): Promise<void> {
    const server = this.server;
    return new Promise((resolve) => {
      server.close(() => {
        resolve();
      });
      server.closeAllConnections();
    });
  }

  private createServer(): Server {
    return createServer((request, response) => {
      this.handle(request, response).catch((error: unknown) => {
        if (!response.headersSent) this.send(response, 500, { error: `receiver error: ${String(error)}` });
      });
    });
  }

  private takeFault(op: 'apply' | 'lookup', key: string, kind: string | null): FaultMode | null {
    for (const slot of this.faults) {
      if (slot.left <= 0 || slot.fault.op !== op) continue;
      if (slot.fault.key !== undefined && slot.fault.key !== key) continue;
      if (slot.fault.kind !== undefined && slot.fault.kind !== kind) continue;
      slot.left -= 1;
      return slot.fault.mode;
    }
    return null;
  }

  private async handle(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const url = new URL(request.url ?? '/', 'http://receiver');
    if (request.method === 'GET' && url.pathname === '/health') return this.send(response, 200, { ok: true, availability: this.availability });
    if (request.method === 'GET' && url.pathname === '/applications') return this.send(response, 200, { applications: this.applications });
    if (request.method === 'POST' && url.pathname === '/control') return this.control(await readBody(request), response);
    if (request.method === 'POST' && url.pathname === '/effects') return this.apply(request, response);
    const lookup = /^\/effects\/([^/]+)$/.exec(url.pathname);
    if (request.method === 'GET' && lookup?.[1] !== undefined) return this.lookup(decodeURIComponent(lookup[1]), response);
    this.send(response, 404, { error: 'no such route' });
  }

  private async apply(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const keyHeader = request.headers['idempotency-key'];
    const key = typeof keyHeader === 'string' ? keyHeader.trim() : '';
    const text = await readBody(request);
    let body: unknown;
    try {
      body = JSON.parse(text) as unknown;
    } catch {
      body = undefined;
    }
    const intent = (body as { intent?: unknown } | undefined)?.intent;
    const kindValue = (intent as { kind?: unknown } | undefined)?.kind;
    const kind = typeof kindValue === 'string' ? kindValue : null;
    const record: ReceivedRequest = { seq: this.requests.length + 1, op: 'apply', key, kind, outcome: 'pending' };
    this.requests.push(record);
    if (key === '' || key.length > 255) return this.answer(record, response, 400, { error: 'an Idempotency-Key header (1-255 characters) is required' });
    if (intent === undefined || kind === null) return this.answer(record, response, 400, { error: 'the body must be { intent: { kind, ... } }' });

    await this.beforeApply?.({ key, kind, intent });
    if (this.availability === 'unavailable') return this.answer(record, response, 503, { error: 'service unavailable' }, { 'retry-after': this.retryAfter });
    const fault = this.takeFault('apply', key, kind);
    if (fault === 'unavailable') return this.answer(record, response, 503, { error: 'service unavailable (injected)' }, { 'retry-after': this.retryAfter });
    if (fault === 'fail-before-apply') return this.answer(record, response, 500, { error: 'internal error before applying (injected)' });
    if (fault === 'drop-connection') {
      record.outcome = 'dropped';
      request.socket.destroy();
      return;
    }

    const fingerprint = createHash('sha256').update(canonical(intent)).digest('hex');
    const existing = this.byKey.get(key);
    if (existing) {
      if (existing.fingerprint !== fingerprint) return this.answer(record, response, 422, { error: 'this Idempotency-Key was used with a different request' });
      if (fault === 'apply-then-hang') {
        record.outcome = 'hung';
        return;
      }
      return this.answer(record, response, 200, { ...this.result(existing), replayed: true });
    }
    const application: Application = {
      seq: this.applications.length + 1,
      key,
      kind,
      intent,
      effectId: `rcv-${String(this.applications.length + 1).padStart(6, '0')}`,
      appliedAtMs: this.now(),
      fingerprint,
    };
    this.applications.push(application);
    this.byKey.set(key, application);
    if (fault === 'apply-then-hang') {
      // Applied, and the answer never comes: the client times out not knowing.
      record.outcome = 'hung';
      return;
    }
    await this.afterApply?.(application);
    this.answer(record, response, 201, { ...this.result(application), replayed: false });
  }

  private lookup(key: string, response: ServerResponse): void {
    const record: ReceivedRequest = { seq: this.requests.length + 1, op: 'lookup', key, kind: null, outcome: 'pending' };
    this.requests.push(record);
    if (this.availability === 'unavailable') return this.answer(record, response, 503, { error: 'service unavailable' });
    const fault = this.takeFault('lookup', key, null);
    if (fault === 'unavailable' || fault === 'fail-before-apply') return this.answer(record, response, fault === 'unavailable' ? 503 : 500, { error: `lookup failed (injected ${fault})` });
    if (fault === 'drop-connection') {
      record.outcome = 'dropped';
      response.socket?.destroy();
      return;
    }
    if (fault === 'apply-then-hang') {
      record.outcome = 'hung';
      return;
    }
    const application = this.byKey.get(key);
    if (!application) return this.answer(record, response, 404, { found: false });
    this.answer(record, response, 200, { ...this.result(application), kind: application.kind });
  }

  private control(text: string, response: ServerResponse): Promise<void> | void {
    let body: { availability?: unknown; faults?: unknown; clearFaults?: unknown };
    try {
      body = JSON.parse(text) as typeof body;
    } catch {
      return this.send(response, 400, { error: 'invalid JSON' });
    }
    if (body.clearFaults === true) this.clearFaults();
    if (Array.isArray(body.faults)) {
      for (const fault of body.faults as Fault[]) this.inject({ ...fault, times: typeof fault.times === 'number' ? fault.times : Number.POSITIVE_INFINITY });
    }
    const availability = body.availability;
    if (availability === 'up' || availability === 'unavailable') {
      return this.setAvailability(availability).then(() => this.send(response, 200, { availability }));
    }
    // `refused` over HTTP would cut off the control channel itself: only the in-process API offers it.
    this.send(response, 200, { availability: this.availability, faults: this.faults.length });
  }

  private result(application: Application) {
    return { key: application.key, effectId: application.effectId, appliedAtMs: application.appliedAtMs };
  }

  private answer(record: ReceivedRequest, response: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
    record.outcome = status;
    this.send(response, status, body, headers);
  }

  private send(response: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
    if (response.destroyed) return;
    response.writeHead(status, { 'content-type': 'application/json', ...headers });
    response.end(JSON.stringify(body));
  }
}

function readBody(request: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    request.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) {
        reject(new Error('request body too large'));
        request.destroy();
        return;
      }
      chunks.push(chunk);
    });
    request.on('end', () => {
      resolve(Buffer.concat(chunks).toString('utf8'));
    });
    request.on('error', reject);
  });
}

async function main(): Promise<void> {
  const portFlag = process.argv.indexOf('--port');
  const port = portFlag === -1 ? 8787 : Number(process.argv[portFlag + 1]);
  const receiver = await Receiver.start({ port });
  console.log(`receiver listening on ${receiver.url} (set PHASELINE_RECEIVER_URL=${receiver.url})`);
  const shutdown = () => {
    void receiver.stop().then(() => process.exit(0));
  };
  process.on('SIGINT', shutdown);
  process.on('SIGTERM', shutdown);
}

if (require.main === module) {
  main().catch((error: unknown) => {
    console.error(error);
    process.exit(1);
  });
}
