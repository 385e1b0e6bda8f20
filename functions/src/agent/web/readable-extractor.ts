/**
 * Readable text of a fetched page, made off the step's thread. Parsing and Readability are
 * synchronous and, on hostile markup, slow beyond any budget (minutes for a 55 KB page of nested
 * elements); on the step's thread that stops its heartbeat and every other step of the process.
 * So a page goes through two guards:
 *
 * 1. A linear scan of the markup (markup-shape.ts) refuses a page nested too deep or with too many
 *    elements before anything parses it.
 * 2. The parse and extraction run in a worker thread (readable-worker.ts) under a wall-clock limit;
 *    past it the worker is terminated. A worker that ran out of its heap is treated the same way.
 *
 * Both end as a `too_complex` outcome the model reads ("too complex to read"), never as a retry:
 * the same page would fail the same way. Workers are reused one request at a time; an idle one
 * does not keep the process alive and is stopped after a while.
 *
 * Where the worker script is: beside this module, `readable-worker.js` in the compiled build
 * (functions/lib, what is deployed). Run from source (jest, tsx) only `readable-worker.ts` exists,
 * and a worker thread does not get its parent's TypeScript transform: it is loaded through tsx's
 * require hook, a dev dependency that is there whenever the source runs.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { Worker } from 'node:worker_threads';
import { realTimers, type Timers } from '../../core/flusher';
import { DEFAULT_MARKUP_LIMITS, measureMarkup, type MarkupLimits } from './markup-shape';
import type { PageKind } from './page-fetcher';
import type { ReadablePage } from './text-budget';

export interface ExtractionRequest {
  readonly id: number;
  readonly kind: PageKind;
  readonly text: string;
}

export type ExtractionReply = { readonly id: number; readonly ok: true; readonly page: ReadablePage } | { readonly id: number; readonly ok: false; readonly message: string };

export type ExtractionOutcome =
  | { readonly ok: true; readonly page: ReadablePage }
  /** `too_complex`: refused by the scan, stopped at the time limit or out of memory. `unreadable`: the extraction itself failed. */
  | { readonly ok: false; readonly reason: 'too_complex' | 'unreadable'; readonly message: string };

export interface ReadableExtractor {
  /** The page's readable text, or why there is none; throws only the caller's abort and a worker that cannot run at all. */
  extract(text: string, kind: PageKind, signal: AbortSignal): Promise<ExtractionOutcome>;
}

export interface ReadableExtractorOptions {
  /** Wall-clock limit of one extraction, from the moment it is handed to a worker. */
  readonly timeLimitMs?: number;
  readonly markupLimits?: MarkupLimits;
  /** Heap of one worker thread; past it the worker dies and the page is too complex. */
  readonly maxHeapMb?: number;
  /** Timers of the time limit; real ones by default. */
  readonly timers?: Timers;
}

/** Readability takes about a second on the largest pages the scan lets through (2 MB, depth 256); this leaves room for a loaded machine. */
export const DEFAULT_EXTRACTION_TIME_LIMIT_MS = 10_000;
/** The step function has 512 MiB; a 2 MB page's DOM takes well under this. */
const DEFAULT_MAX_HEAP_MB = 256;
/** An idle worker is stopped after this long, so a quiet process does not keep its memory. */
const IDLE_WORKER_MS = 10_000;
const MAX_IDLE_WORKERS = 1;
const WORKER_ENTRY = 'readable-worker';

function tooComplex(why: string): ExtractionOutcome {
  return { ok: false, reason: 'too_complex', message: `The page is too complex to read: ${why}. It was not read; try another source.` };
}

function startWorker(maxHeapMb: number): Worker {
  const resourceLimits = { maxOldGenerationSizeMb: maxHeapMb };
  const compiled = join(__dirname, `${WORKER_ENTRY}.js`);
  if (existsSync(compiled)) return new Worker(compiled, { resourceLimits });
  const source = join(__dirname, `${WORKER_ENTRY}.ts`);
  const hook = require.resolve('tsx/cjs');
  return new Worker(`require(${JSON.stringify(hook)});\nrequire(${JSON.stringify(source)});`, { eval: true, resourceLimits });
}

class WorkerPool {
  private readonly idle: { worker: Worker; expiry: ReturnType<typeof setTimeout> }[] = [];

  constructor(readonly maxHeapMb: number) {}

  acquire(): Worker {
    const reused = this.idle.pop();
    if (reused === undefined) {
      const worker = startWorker(this.maxHeapMb);
      // A request reports its worker's failure; between requests (or after one ended) an 'error' must not go unheard and crash the process.
      worker.on('error', () => undefined);
      worker.once('exit', () => this.drop(worker));
      return worker;
    }
    clearTimeout(reused.expiry);
    reused.worker.ref();
    return reused.worker;
  }

  /** A worker that answered its request and can take another. */
  release(worker: Worker): void {
    if (this.idle.length >= MAX_IDLE_WORKERS) {
      void worker.terminate();
      return;
    }
    worker.unref();
    const entry = { worker, expiry: setTimeout(() => this.retire(worker), IDLE_WORKER_MS) };
    entry.expiry.unref();
    this.idle.push(entry);
  }

  private retire(worker: Worker): void {
    this.drop(worker);
    void worker.terminate();
  }

  private drop(worker: Worker): void {
    const at = this.idle.findIndex((entry) => entry.worker === worker);
    if (at < 0) return;
    const [entry] = this.idle.splice(at, 1);
    if (entry !== undefined) clearTimeout(entry.expiry);
  }
}

class WorkerReadableExtractor implements ReadableExtractor {
  private readonly timeLimitMs: number;
  private readonly markupLimits: MarkupLimits;
  private readonly timers: Timers;
  private readonly pool: WorkerPool;
  private nextId = 0;

  constructor(options: ReadableExtractorOptions) {
    this.timeLimitMs = options.timeLimitMs ?? DEFAULT_EXTRACTION_TIME_LIMIT_MS;
    this.markupLimits = options.markupLimits ?? DEFAULT_MARKUP_LIMITS;
    this.timers = options.timers ?? realTimers;
    this.pool = new WorkerPool(options.maxHeapMb ?? DEFAULT_MAX_HEAP_MB);
  }

  extract(text: string, kind: PageKind, signal: AbortSignal): Promise<ExtractionOutcome> {
    signal.throwIfAborted();
    if (kind === 'html') {
      const shape = measureMarkup(text, this.markupLimits);
      if (shape.over === 'depth') return Promise.resolve(tooComplex(`its elements nest more than ${this.markupLimits.maxDepth} levels deep`));
      if (shape.over === 'elements') return Promise.resolve(tooComplex(`it has more than ${this.markupLimits.maxElements} elements`));
    }
    return this.inWorker({ id: ++this.nextId, kind, text }, signal);
  }

  private inWorker(request: ExtractionRequest, signal: AbortSignal): Promise<ExtractionOutcome> {
    const worker = this.pool.acquire();
    return new Promise<ExtractionOutcome>((resolve, reject) => {
      let settled = false;
      const timer = this.timers.setTimeout(() => finish({ outcome: tooComplex(`reading it took longer than ${this.timeLimitMs} ms and was stopped`) }, false), this.timeLimitMs);
      /** Ends the request once; a worker that answered goes back to the pool, any other is terminated. */
      const finish = (result: { outcome: ExtractionOutcome } | { error: Error }, reusable: boolean): void => {
        if (settled) return;
        settled = true;
        this.timers.clearTimeout(timer);
        signal.removeEventListener('abort', onAbort);
        worker.off('message', onMessage);
        worker.off('error', onError);
        worker.off('exit', onExit);
        if (reusable) this.pool.release(worker);
        else void worker.terminate();
        if ('outcome' in result) resolve(result.outcome);
        else reject(result.error);
      };
      const onMessage = (reply: ExtractionReply): void => {
        if (reply.id !== request.id) return;
        finish({ outcome: reply.ok ? { ok: true, page: reply.page } : { ok: false, reason: 'unreadable', message: reply.message } }, true);
      };
      const onError = (error: Error): void => {
        if ((error as NodeJS.ErrnoException).code === 'ERR_WORKER_OUT_OF_MEMORY') {
          finish({ outcome: tooComplex(`reading it needed more than ${this.pool.maxHeapMb} MB of memory`) }, false);
          return;
        }
        finish({ error: new Error(`The readable-text worker failed: ${error.message}`, { cause: error }) }, false);
      };
      const onExit = (code: number): void => finish({ error: new Error(`The readable-text worker stopped (exit code ${code}) before it answered`) }, false);
      const onAbort = (): void => finish({ error: signal.reason as Error }, false);
      worker.on('message', onMessage);
      worker.on('error', onError);
      worker.on('exit', onExit);
      signal.addEventListener('abort', onAbort, { once: true });
      worker.postMessage(request);
    });
  }
}

export function createReadableExtractor(options: ReadableExtractorOptions = {}): ReadableExtractor {
  return new WorkerReadableExtractor(options);
}

let shared: ReadableExtractor | undefined;

/** The process's extractor with the default limits: its idle worker serves every toolbox. */
export function defaultReadableExtractor(): ReadableExtractor {
  shared ??= createReadableExtractor();
  return shared;
}
