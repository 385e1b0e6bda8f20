/** The research pipeline on the emulator harness with the offline provider and observable wrappers. */
import type { ChatRequest, ChatResponse, ModelProvider, ToolCall } from '../../functions/src/agent/provider';
import type { SectionPolicy } from '../../functions/src/agent/section-runner';
import type { Toolbox, ToolResult } from '../../functions/src/agent/tools';
import { createMemoryArtifactStore } from '../../functions/src/agent/web/artifacts';
import { createPageFetcher } from '../../functions/src/agent/web/page-fetcher';
import { createSearxngBackend } from '../../functions/src/agent/web/search';
import { createWebToolbox } from '../../functions/src/agent/web/toolbox';
import type { Clock } from '../../functions/src/core/clock';
import type { Timers } from '../../functions/src/core/flusher';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { createResearchPipeline, type ResearchDeps } from '../../functions/src/pipelines/research';
import { createCorpusToolbox, createOfflineProvider, type CorpusToolbox, type OfflineSettingsInput } from '../../functions/src/providers/offline';
import { firestoreCircuit } from '../../functions/src/store/provider-circuit';
import type { Firestore } from 'firebase-admin/firestore';

/** Backoff waits inside a section return at once: the tests move the injected clock instead. */
export const immediateTimers: Timers = {
  setTimeout: (callback) => setImmediate(callback),
  clearTimeout: (handle) => {
    clearImmediate(handle as NodeJS.Immediate);
  },
};

/** The prompt ID of the section a request belongs to (the latest marked user message). */
export function promptIdOf(request: ChatRequest): string {
  for (let index = request.messages.length - 1; index >= 0; index -= 1) {
    const message = request.messages[index];
    if (message?.role === 'user' && message.promptId) return message.promptId;
  }
  return '?';
}

export type Interceptor = (request: ChatRequest, call: () => Promise<ChatResponse>) => Promise<ChatResponse>;

/** A provider wrapper that records every request and lets a test intercept calls. */
export class ObservedProvider implements ModelProvider {
  readonly requests: ChatRequest[] = [];
  intercept: Interceptor | null = null;
  constructor(private readonly inner: ModelProvider) {}
  get name(): string {
    return this.inner.name;
  }
  get contextWindowTokens(): number {
    return this.inner.contextWindowTokens;
  }
  chat(request: ChatRequest): Promise<ChatResponse> {
    this.requests.push(request);
    const call = () => this.inner.chat(request);
    return this.intercept ? this.intercept(request, call) : call();
  }
  /** Requests made more than once for the same point of the same section's thread. */
  repeatedRequests(): string[] {
    const counts = new Map<string, number>();
    for (const request of this.requests) {
      const key = `${promptIdOf(request)}@${request.messages.length}`;
      counts.set(key, (counts.get(key) ?? 0) + 1);
    }
    return [...counts.entries()].filter(([, count]) => count > 1).map(([key]) => key);
  }
}

export interface ResearchSetup {
  readonly provider: ObservedProvider;
  readonly toolbox: CorpusToolbox;
  readonly registry: ReturnType<typeof pipelineRegistry>;
}

export function researchSetup(db: Firestore, clock: Clock, settings: OfflineSettingsInput = {}, policy: Partial<SectionPolicy> = {}): ResearchSetup {
  const provider = new ObservedProvider(createOfflineProvider({ seed: 11, settings: { inputUsdPer1kTokens: 0.5, outputUsdPer1kTokens: 1.5, ...settings }, clock, sleep: () => Promise.resolve() }));
  const toolbox = createCorpusToolbox({ settings, seed: 11 });
  const deps: ResearchDeps = {
    provider,
    toolbox,
    circuit: firestoreCircuit(db, provider.name, { failureThreshold: 3, windowMs: 60_000, coolDownMs: 60_000 }),
    policy: { transientRetries: 1, transientMinDelayMs: 1, transientMaxDelayMs: 5, ...policy },
    timers: immediateTimers,
  };
  return { provider, toolbox, registry: pipelineRegistry(createResearchPipeline(() => deps)) };
}

/** Never settles: a worker frozen (or killed) at this point. */
export const hangForever = (): Promise<never> => new Promise<never>(() => undefined);

/** Counts a toolbox's executions by call ID (the web toolbox keeps no count of its own). */
export class CountingToolbox implements Toolbox {
  constructor(
    private readonly inner: Toolbox,
    /** Every call executed, in order, repeats included (shared with the toolboxes `forJob` binds). */
    readonly executed: ToolCall[] = [],
  ) {}
  get specs() {
    return this.inner.specs;
  }
  execute(call: ToolCall, signal: AbortSignal): Promise<ToolResult> {
    this.executed.push(call);
    return this.inner.execute(call, signal);
  }
  forJob(jobId: string): CountingToolbox {
    return new CountingToolbox(this.inner.forJob?.(jobId) ?? this.inner, this.executed);
  }
  /** Call IDs executed more than once, with their counts. */
  repeated(): [string, number][] {
    const counts = new Map<string, number>();
    for (const call of this.executed) counts.set(call.id, (counts.get(call.id) ?? 0) + 1);
    return [...counts.entries()].filter(([, count]) => count > 1);
  }
}

export interface WebResearchSetup {
  readonly provider: ObservedProvider;
  readonly toolbox: CountingToolbox;
  readonly registry: ReturnType<typeof pipelineRegistry>;
}

/**
 * The research pipeline with the offline provider on the web tools, as `PHASELINE_SEARCH=searxng`
 * configures them: search through the SearXNG backend at `searxngUrl`, and fetch_page allowed to
 * reach that server's port on 127.0.0.1 (where the local servers run) and nothing else that is not public.
 */
export function webResearchSetup(db: Firestore, clock: Clock, searxngUrl: string, settings: OfflineSettingsInput = {}): WebResearchSetup {
  const provider = new ObservedProvider(createOfflineProvider({ seed: 11, settings, clock, sleep: () => Promise.resolve() }));
  const toolbox = new CountingToolbox(
    createWebToolbox({
      search: createSearxngBackend({ baseUrl: searxngUrl, timeoutMs: 15_000 }),
      pages: createPageFetcher({ timeoutMs: 15_000, maxBytes: 2_000_000, maxRedirects: 5, allowedAddresses: [{ address: '127.0.0.1', port: Number(new URL(searxngUrl).port) }] }),
      artifacts: createMemoryArtifactStore(),
      clock,
      pageTokenBudget: 4_000,
    }),
  );
  const deps: ResearchDeps = {
    provider,
    toolbox,
    circuit: firestoreCircuit(db, provider.name, { failureThreshold: 3, windowMs: 60_000, coolDownMs: 60_000 }),
    policy: { transientRetries: 1, transientMinDelayMs: 1, transientMaxDelayMs: 5 },
    timers: immediateTimers,
  };
  return { provider, toolbox, registry: pipelineRegistry(createResearchPipeline(() => deps)) };
}
