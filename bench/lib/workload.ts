/**
 * The research workload every implementation runs: the same inputs, the same offline provider
 * (seed, latency), the same section policy and the same fault schedule.
 *
 * Latency is real: every model call waits MODEL_LATENCY_MS on a real timer (the offline
 * provider's `latencyMs` through its `sleep`), injected errors included. Tool calls (the bundled
 * corpus) add none. What would be waiting in production (lease expiry, backoff, a task's
 * redelivery) is not slept: Phaseline's runs it on an injected clock, the baselines' is computed
 * from their retry rules, and both are reported as "recovery wait (virtual)".
 */
import type { ProviderCircuit } from '../../functions/src/core/circuit';
import type { SectionPolicy } from '../../functions/src/agent/section-runner';
import type { Clock } from '../../functions/src/core/clock';
import { pipelineRegistry, type PipelineDefinition, type PipelineRegistry } from '../../functions/src/core/pipeline';
import { createCorpusToolbox, createOfflineProvider, realSleep, type CorpusToolbox } from '../../functions/src/providers/offline';
import { createResearchPipeline, type ResearchInput } from '../../functions/src/pipelines/research';
import { FaultInjectingProvider, liveWorkerTimers, type Fault } from './faults';

/** Real wait per model call, in ms. */
export const MODEL_LATENCY_MS = 10;
export const PROVIDER_SEED = 11;

export const RESEARCH_INPUTS: readonly ResearchInput[] = [
  { question: 'How do leases and fencing tokens keep stale workers from corrupting results?', experts: 2, sections: 3, wordsPerSection: 80 },
  { question: 'When should a long-running agent checkpoint its work, and what does checkpointing cost?', experts: 2, sections: 3, wordsPerSection: 80 },
];

/** Agent sections (one bounded unit of agent output each) in a research job. */
export function agentSections(input: ResearchInput): number {
  return 2 + input.experts * input.sections + input.sections;
}

/** The same for every implementation: in-call retries of transient errors with short real backoff. */
export const SECTION_POLICY: Partial<SectionPolicy> = { transientRetries: 2, transientMinDelayMs: 5, transientMaxDelayMs: 40 };

/** One of each kind of trouble, at fixed logical points of a job (experts: 2, sections: 3). */
export const FAULT_SCHEDULE: readonly Fault[] = [
  { kind: 'crash', promptId: 'e1-h2', atCall: 2 },
  { kind: 'outage', promptId: 'e2-h3', atCall: 1, calls: 3 },
  { kind: 'malformed', promptId: 'e2-h1' },
  { kind: 'stall', promptId: 'final-h2', atCall: 2 },
];

/** A circuit that never opens: the baselines have none. */
export const closedCircuit: ProviderCircuit = {
  check: () => Promise.resolve({ open: false, untilMs: null }),
  recordOutage: () => Promise.resolve({ open: false, untilMs: null }),
  recordSuccess: () => Promise.resolve(),
};

export interface ResearchKit {
  readonly pipeline: PipelineDefinition<unknown>;
  readonly registry: PipelineRegistry;
  readonly provider: FaultInjectingProvider;
  readonly toolbox: CorpusToolbox;
}

/** A fresh provider, toolbox and pipeline for one job run, so its calls are counted alone. */
export function researchKit(clock: Clock, faults: readonly Fault[], circuit: ProviderCircuit, latencyMs = MODEL_LATENCY_MS): ResearchKit {
  const inner = createOfflineProvider({ seed: PROVIDER_SEED, settings: { latencyMs }, clock, sleep: realSleep });
  const provider = new FaultInjectingProvider(inner, faults, latencyMs, realSleep);
  const toolbox = createCorpusToolbox({ seed: PROVIDER_SEED });
  const pipeline = createResearchPipeline(() => ({ provider, toolbox, circuit, policy: SECTION_POLICY, timers: liveWorkerTimers }));
  const registry = pipelineRegistry(pipeline);
  return { pipeline: registry.get('research') as PipelineDefinition<unknown>, registry, provider, toolbox };
}
