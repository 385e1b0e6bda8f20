/**
 * The fault schedule and the machinery that applies it the same way to every implementation.
 *
 * Faults are keyed by section (the prompt ID of the model call) and by the ordinal of the call
 * within that section, counted over the whole run of a job (restarts included), so the same
 * fault hits the same logical point whatever the interleaving of parallel work, and each one-shot
 * fault fires once. Whoever made the call is found through AsyncLocalStorage: every task
 * (Phaseline) or attempt (baselines) runs inside `runAsWorker`, and a crash or a stall tells that
 * worker it is gone.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { createHash } from 'node:crypto';
import { MalformedResponseError, ProviderUnavailableError, type ChatRequest, type ChatResponse, type ModelProvider } from '../../functions/src/agent/provider';
import type { Timers } from '../../functions/src/core/flusher';
import type { Sleep } from '../../functions/src/providers/offline';

export type Fault =
  /** The worker process is killed during this call: nothing after it runs. */
  | { readonly kind: 'crash'; readonly promptId: string; readonly atCall: number }
  /**
   * The worker freezes during this call (a paused VM, a partition) and wakes only after its
   * replacement finished the job; then it carries on as if nothing happened (a zombie).
   */
  | { readonly kind: 'stall'; readonly promptId: string; readonly atCall: number }
  /** `calls` consecutive calls of the section fail with 503: longer than the in-call retries last. */
  | { readonly kind: 'outage'; readonly promptId: string; readonly atCall: number; readonly calls: number }
  /** Every call of the section returns garbage: the section is eventually skipped. */
  | { readonly kind: 'malformed'; readonly promptId: string };

export function describeFault(fault: Fault): string {
  switch (fault.kind) {
    case 'crash':
      return `worker killed during model call ${fault.atCall} of section ${fault.promptId}`;
    case 'stall':
      return `worker frozen during model call ${fault.atCall} of section ${fault.promptId}; wakes after its replacement finished (zombie)`;
    case 'outage':
      return `${fault.calls} consecutive 503s from model call ${fault.atCall} of section ${fault.promptId} (outlasts the in-call retries)`;
    case 'malformed':
      return `every model call of section ${fault.promptId} returns a malformed response (the section is skipped)`;
  }
}

/** One task (Phaseline) or one attempt (baselines), as the fault injector sees it. */
export interface Worker {
  readonly name: string;
  /** Set once a crash or stall hit this worker: its timers stop firing. */
  readonly gone: boolean;
  crashed(): void;
  stalled(): void;
}

const currentWorker = new AsyncLocalStorage<Worker>();

export function runAsWorker<T>(worker: Worker, work: () => Promise<T>): Promise<T> {
  return currentWorker.run(worker, work);
}

/** The name of the worker the calling code runs in (what started it, for work it left running), if any. */
export function currentWorkerName(): string | undefined {
  return currentWorker.getStore()?.name;
}

export interface WorkerHandle extends Worker {
  /** Settles with the kind of fault once the worker is gone. */
  readonly down: Promise<'crash' | 'stall'>;
}

export function newWorker(name: string, onCrash?: () => void): WorkerHandle {
  let settle: (kind: 'crash' | 'stall') => void = () => undefined;
  const down = new Promise<'crash' | 'stall'>((resolve) => {
    settle = resolve;
  });
  const worker = {
    name,
    gone: false,
    down,
    crashed() {
      worker.gone = true;
      onCrash?.();
      settle('crash');
    },
    stalled() {
      worker.gone = true;
      settle('stall');
    },
  };
  return worker;
}

/**
 * Real timers (unref'd, so they never keep the process alive) that stop firing once the worker
 * that set them is gone: a killed or frozen worker neither heartbeats nor flushes.
 */
export const liveWorkerTimers: Timers = {
  setTimeout(callback, ms) {
    const worker = currentWorker.getStore();
    const handle = setTimeout(() => {
      if (!worker?.gone) callback();
    }, ms);
    handle.unref();
    return handle;
  },
  clearTimeout(handle) {
    clearTimeout(handle as ReturnType<typeof setTimeout>);
  },
};

/** The prompt ID of the section a request belongs to (its latest marked user message). */
export function promptIdOf(request: ChatRequest): string {
  for (let index = request.messages.length - 1; index >= 0; index -= 1) {
    const message = request.messages[index];
    if (message?.role === 'user' && message.promptId) return message.promptId;
  }
  return '?';
}

/** Identifies a request by everything the model would see. */
function requestKey(request: ChatRequest): string {
  const messages = request.messages.map((message) => {
    switch (message.role) {
      case 'assistant':
        return [message.role, message.content, (message.toolCalls ?? []).map((call) => [call.id, call.name, call.arguments])];
      case 'tool':
        return [message.role, message.toolCallId, message.content];
      default:
        return [message.role, message.content];
    }
  });
  return createHash('sha256').update(JSON.stringify(messages)).digest('hex');
}

export interface FaultEvent {
  readonly fault: Fault['kind'];
  readonly promptId: string;
  readonly call: number;
  readonly worker: string;
}

/** Wraps a provider: counts every call and applies the schedule. */
export class FaultInjectingProvider implements ModelProvider {
  calls = 0;
  /** Calls whose request (every message of it) had been sent before in this run. */
  repeatedCalls = 0;
  private readonly requestsSeen = new Set<string>();
  readonly events: FaultEvent[] = [];
  private readonly callsByPrompt = new Map<string, number>();
  private readonly fired = new Set<number>();
  private readonly outageLeft = new Map<number, number>();
  private readonly frozen: (() => void)[] = [];

  constructor(
    private readonly inner: ModelProvider,
    private readonly faults: readonly Fault[],
    /** Injected errors answer after the same latency a real call has. */
    private readonly latencyMs: number,
    private readonly sleep: Sleep,
  ) {}

  get name(): string {
    return this.inner.name;
  }

  get contextWindowTokens(): number {
    return this.inner.contextWindowTokens;
  }

  /** Wakes every frozen worker; returns how many there were. */
  wakeFrozen(): number {
    const woken = this.frozen.splice(0);
    for (const wake of woken) wake();
    return woken.length;
  }

  async chat(request: ChatRequest): Promise<ChatResponse> {
    this.calls += 1;
    const key = requestKey(request);
    if (this.requestsSeen.has(key)) this.repeatedCalls += 1;
    else this.requestsSeen.add(key);
    const promptId = promptIdOf(request);
    const call = (this.callsByPrompt.get(promptId) ?? 0) + 1;
    this.callsByPrompt.set(promptId, call);
    const worker = currentWorker.getStore();
    const record = (fault: Fault['kind']) => this.events.push({ fault, promptId, call, worker: worker?.name ?? '?' });

    for (const [index, fault] of this.faults.entries()) {
      if (fault.promptId !== promptId) continue;
      switch (fault.kind) {
        case 'malformed':
          record('malformed');
          await this.sleep(this.latencyMs, request.signal);
          throw new MalformedResponseError('bench: injected malformed response');
        case 'outage': {
          if (call < fault.atCall) break;
          const left = this.outageLeft.get(index) ?? fault.calls;
          if (left <= 0) break;
          this.outageLeft.set(index, left - 1);
          record('outage');
          await this.sleep(this.latencyMs, request.signal);
          throw new ProviderUnavailableError('bench: injected 503');
        }
        case 'crash':
          if (call !== fault.atCall || this.fired.has(index)) break;
          this.fired.add(index);
          if (!worker) throw new Error('bench: a crash outside any worker');
          record('crash');
          worker.crashed();
          // Nothing more happens in this worker: the call never answers (an attempt whose signal
          // is aborted by its crash handler ends with the abort reason instead).
          return new Promise<never>((_resolve, reject) => {
            if (request.signal.aborted) reject(request.signal.reason as Error);
            else request.signal.addEventListener('abort', () => reject(request.signal.reason as Error), { once: true });
          });
        case 'stall':
          if (call !== fault.atCall || this.fired.has(index)) break;
          this.fired.add(index);
          if (!worker) throw new Error('bench: a stall outside any worker');
          record('stall');
          worker.stalled();
          await new Promise<void>((resolve) => this.frozen.push(resolve));
          return this.inner.chat(request);
      }
    }
    return this.inner.chat(request);
  }
}
