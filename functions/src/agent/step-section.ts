/**
 * Runs one agent section inside a step: the section runner (section-runner.ts: warm, cold, skip)
 * bound to the step. Transcripts are persisted under the job (owner-checked) and validated when read
 * back, cost is flushed live, every model call is bounded by the step's remaining time, tools are
 * bound to the step (an effectful tool goes through its ledger), and the shared provider circuit is
 * consulted before and informed after. A provider that asks for a delay longer than the engine's
 * cap (`maxServerDelayMs`) is treated as down: the job waits, resuming at the cap. The section's
 * opening reads (the circuit, its stored transcript, the first call's spend check) run side by side,
 * and its final answer's save is made behind the work where the step context can
 * (`saveTranscriptBehind`): the step keeps it on record before anything that depends on it.
 */
import type { CircuitState, ProviderCircuit } from '../core/circuit';
import { describeError, PhaselineError } from '../core/errors';
import type { Timers } from '../core/flusher';
import type { PhaseOutcome, StepContext, UnitOutcome } from '../core/pipeline';
import { capServerDelay } from '../core/server-delay';
import { isProviderOutage, type ModelProvider } from './provider';
import { runSection, type CostTally, type SectionOutcome, type SectionPolicy, type SectionSpec, type StoredTranscript, type UsageEntry } from './section-runner';
import { ToolWaitError, type Toolbox } from './tools';
import { parseStoredTranscript, storableTranscript } from './transcript-schema';

/**
 * What an agent section runs with. Any model goes in as `provider`: the own OpenAI-compatible
 * client, the offline simulator, or any AI SDK `LanguageModel` through the adapter.
 *
 * @example
 * import { createAiSdkProvider } from '../providers/ai-sdk';
 * const agent: AgentDeps = {
 *   provider: createAiSdkProvider({ model: anthropic('claude-sonnet-4-5'), timeoutMs: 120_000, contextWindowTokens: 200_000, inputUsdPer1kTokens: 0.003, outputUsdPer1kTokens: 0.015 }),
 *   toolbox: createToolbox([lookupOrder, refundOrder]),
 * };
 */
export interface AgentDeps {
  readonly provider: ModelProvider;
  /** The tools offered to the model: `createToolbox([...defineTool(...)])`, or any Toolbox. */
  readonly toolbox: Toolbox;
  /**
   * The provider's shared circuit (store/provider-circuit.ts `firestoreCircuit`): an outage seen by
   * one worker makes every job wait instead of hammering the provider. Without one, an outage is
   * thrown to the engine, which requeues the job with backoff.
   */
  readonly circuit?: ProviderCircuit;
  /** Overrides of the section's retry policy (DEFAULT_SECTION_POLICY). */
  readonly policy?: Partial<SectionPolicy>;
  /** Timers for in-call backoff waits; real ones by default. */
  readonly timers?: Timers;
}

/**
 * A dependency is down (the model provider, or the target of an effectful tool): the step should
 * wait, visibly, and resume by itself at `untilMs`. `agentWait` turns it into a phase's or unit's wait.
 */
export interface ProviderWait {
  readonly kind: 'provider-wait';
  readonly untilMs: number;
  readonly question: string;
}

/** What one agent section ends in: written, skipped, out of time (SectionOutcome), or a wait. */
export type AgentSectionOutcome = SectionOutcome | ProviderWait;

/** A section's wait as a phase's (or a fan-out unit's) outcome: the job waits with reason `provider` until `untilMs`. */
export function agentWait(outcome: ProviderWait): PhaseOutcome<never> & UnitOutcome<never> {
  return { kind: 'wait', reason: 'provider', questionId: 'provider', question: outcome.question, untilMs: outcome.untilMs };
}

/** The field of the job's cost each counter of a section's tally adds to; the job does not keep wasted tokens apart. */
const JOB_COST_FIELD = {
  modelCalls: 'modelCalls', toolCalls: 'toolCalls', inputTokens: 'inputTokens', outputTokens: 'outputTokens', usd: 'spentUsd',
  wastedModelCalls: 'wastedModelCalls', wastedToolCalls: 'wastedToolCalls', wastedUsd: 'wastedUsd',
} as const satisfies Partial<Record<keyof CostTally, string>>;

function costIncrements(entry: UsageEntry): Record<string, number> {
  return Object.fromEntries(Object.entries(JOB_COST_FIELD).map(([counter, field]) => [field, entry.delta[counter as keyof typeof JOB_COST_FIELD]]));
}

/**
 * The shared circuit as one step sees it: read once per step (not around every section), an
 * outage recorded as it happens, and a success written only when the circuit had something to
 * close. A circuit another worker opens mid-step is seen by this step's own next outage.
 */
class StepCircuit {
  private view: Promise<CircuitState> | null = null;

  constructor(private readonly circuit: ProviderCircuit) {}

  check(nowMs: number): Promise<CircuitState> {
    this.view ??= this.circuit.check(nowMs).catch((error: unknown) => {
      this.view = null;
      throw error;
    });
    return this.view;
  }

  async succeeded(nowMs: number): Promise<void> {
    const view = await this.check(nowMs);
    if (view.needsClose === false) return;
    await this.circuit.recordSuccess(nowMs);
    this.view = Promise.resolve({ open: false, untilMs: null, needsClose: false });
  }

  async outage(nowMs: number, detail: string): Promise<CircuitState> {
    const state = await this.circuit.recordOutage(nowMs, detail);
    this.view = Promise.resolve({ ...state, needsClose: true });
    return state;
  }
}

/** One StepCircuit per step (a step is one claim, and each claim has its own abort signal) and circuit. */
const stepCircuits = new WeakMap<AbortSignal, WeakMap<ProviderCircuit, StepCircuit>>();

function circuitForStep(signal: AbortSignal, circuit: ProviderCircuit): StepCircuit {
  let byCircuit = stepCircuits.get(signal);
  if (!byCircuit) {
    byCircuit = new WeakMap();
    stepCircuits.set(signal, byCircuit);
  }
  let view = byCircuit.get(circuit);
  if (!view) {
    view = new StepCircuit(circuit);
    byCircuit.set(circuit, view);
  }
  return view;
}

/**
 * Runs one section of agent work in this step, resuming its stored transcript if a previous worker
 * left one. Returns `written` (the answer), `skipped` (every retry spent; the reason says why),
 * `out-of-time` (the transcript is saved: yield and run it again in the next step), or a
 * `provider-wait`. Throws what the engine must see: a lost claim, a failed save, a provider error
 * with a delay within the cap.
 */
export async function runAgentSection<TInput>(context: StepContext<TInput>, agent: AgentDeps, spec: SectionSpec): Promise<AgentSectionOutcome> {
  const nowMs = context.clock.now();
  const stepCircuit = agent.circuit ? circuitForStep(context.signal, agent.circuit) : null;
  // Reads, side by side: the circuit, the section's stored transcript and the first call's spend check.
  // None depends on another; when the circuit turns out open, the other two are dropped unused.
  const checking = stepCircuit?.check(nowMs);
  const loading = context.loadTranscript(spec.sectionId);
  loading.catch(() => undefined);
  context.spend.readAhead?.();
  const circuit = await checking;
  if (circuit?.open && circuit.untilMs !== null) {
    return { kind: 'provider-wait', untilMs: circuit.untilMs, question: `Provider ${agent.provider.name} unavailable; resuming automatically` };
  }
  let preloaded: Promise<unknown> | null = loading;
  const toolbox =
    agent.toolbox.forStep?.({ jobId: context.jobId, phase: context.phase, unit: context.unit, effects: context.effects, signal: context.signal, clock: context.clock, note: (kind, message) => context.note(kind, message) }) ??
    agent.toolbox.forJob?.(context.jobId) ??
    agent.toolbox;
  try {
    const outcome = await runSection(spec, {
      provider: agent.provider,
      toolbox,
      signal: context.signal,
      random: context.random,
      remainingMs: () => context.remainingMs(),
      ...(agent.policy ? { policy: agent.policy } : {}),
      ...(agent.timers ? { timers: agent.timers } : {}),
      transcripts: {
        load: async (sectionId) => {
          const read = preloaded !== null && sectionId === spec.sectionId ? preloaded : context.loadTranscript(sectionId);
          preloaded = null;
          const stored = await read;
          if (stored === null) return null;
          const parsed = parseStoredTranscript(stored);
          if (parsed.ok) return parsed.transcript;
          // Refused, not trusted: the section starts a clean thread.
          context.note('transcript-refused', `${spec.sectionId}: stored transcript failed validation; starting a clean thread`);
          return null;
        },
        save: (sectionId, transcript) => context.saveTranscript(sectionId, storableTranscript(transcript)),
        // The final answer's save is made behind, where the step can: the next section's first call does not wait for it.
        ...(context.saveTranscriptBehind ? { saveBehind: (sectionId: string, transcript: StoredTranscript) => context.saveTranscriptBehind?.(sectionId, storableTranscript(transcript)) } : {}),
      },
      onUsage: (entry) => context.addCost(costIncrements(entry)),
      onDraft: (text) => context.showDraft(spec.sectionId, text),
      spend: context.spend,
    });
    if (outcome.kind === 'out-of-time') {
      context.note('section-yielded', `${spec.sectionId}: the step's time ran out mid-section (${outcome.reason}); its transcript is saved and the next step goes on`);
    } else {
      await stepCircuit?.succeeded(context.clock.now());
    }
    return outcome;
  } catch (error) {
    if (context.signal.aborted) throw error;
    if (error instanceof ToolWaitError) {
      context.note('tool-waiting', `${spec.sectionId}: ${error.message}`);
      return { kind: 'provider-wait', untilMs: error.untilMs, question: error.message };
    }
    if (!isProviderOutage(error)) throw error;
    const nowMs = context.clock.now();
    const state = stepCircuit ? await stepCircuit.outage(nowMs, describeError(error)) : null;
    const asked = capServerDelay(error instanceof PhaselineError ? error.retryAfterMs : undefined, context.limits.maxServerDelayMs);
    if (asked.capped) {
      // Not honoured as a backoff (a day, a century): an outage with a stated resume time.
      const untilMs = Math.max(nowMs + asked.delayMs, state?.open && state.untilMs !== null ? state.untilMs : 0);
      return { kind: 'provider-wait', untilMs, question: overLongDelayQuestion(agent.provider.name, asked.requestedMs, asked.delayMs, untilMs) };
    }
    if (state?.open && state.untilMs !== null) {
      return { kind: 'provider-wait', untilMs: state.untilMs, question: `Provider ${agent.provider.name} unavailable (${describeError(error)}); resuming automatically` };
    }
    // A delay within the cap (or none): the engine requeues the job and honours it.
    throw error;
  }
}

/** What the person watching the job reads when the provider asked for more than the cap. */
export function overLongDelayQuestion(provider: string, requestedMs: number, capMs: number, untilMs: number): string {
  return (
    `Provider ${provider} asked to wait ${describeDelay(requestedMs)} before the next request; ` +
    `a wait over ${describeDelay(capMs)} is treated as an outage, so the job resumes by itself at ${new Date(untilMs).toISOString()}.`
  );
}

/** A delay in the largest unit that keeps it readable: "90 s", "15 min", "24 h", "3 days", "74 years". */
export function describeDelay(ms: number): string {
  const seconds = Math.round(ms / 1000);
  if (seconds < 120) return `${seconds} s`;
  const minutes = Math.round(seconds / 60);
  if (minutes < 120) return `${minutes} min`;
  const hours = Math.round(minutes / 60);
  if (hours < 48) return `${hours} h`;
  const days = Math.round(hours / 24);
  if (days < 730) return `${days} days`;
  return `${Math.round(days / 365.25).toLocaleString('en-US')} years`;
}
