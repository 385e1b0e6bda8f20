/**
 * Runs one agent section inside a step: transcripts persisted under the job (owner-checked), cost
 * flushed live, every model call bounded by the step's remaining time, and the shared provider
 * circuit consulted before and informed after. A provider that asks for a delay longer than the
 * engine's cap (`maxServerDelayMs`) is treated as down: the job waits, resuming at the cap.
 */
import { z } from 'zod';
import { PhaselineError, capServerDelay, describeError, isProviderOutage, runSection, type CircuitState, type CostTally, type ModelProvider, type ProviderCircuit, type SectionOutcome, type SectionPolicy, type SectionSpec, type StepContext, type StoredTranscript, type Timers, type Toolbox, type UsageEntry } from '../../api';

export interface ResearchDeps {
  readonly provider: ModelProvider;
  readonly toolbox: Toolbox;
  readonly circuit: ProviderCircuit;
  readonly policy?: Partial<SectionPolicy>;
  readonly timers?: Timers;
}

/** The provider is down for everyone: the step should wait (visibly) until the circuit lets probes through. */
export interface ProviderWait {
  readonly kind: 'provider-wait';
  readonly untilMs: number;
  readonly question: string;
}

const toolCall = z.object({ id: z.string(), name: z.string(), arguments: z.string() });
/** Fields in the order the runner writes them, so a loaded message serializes as it was saved. */
const numberedSource = z.object({
  url: z.string(),
  title: z.string(),
  passage: z.string(),
  fetchedAt: z.string(),
  artifact: z.object({ ref: z.string(), sha256: z.string(), size: z.number() }).optional(),
  number: z.number().int().positive(),
});
// `sources` is optional: transcripts saved before sources were recorded still load.
const chatMessage = z.discriminatedUnion('role', [
  z.object({ role: z.literal('system'), content: z.string() }),
  z.object({ role: z.literal('user'), content: z.string(), promptId: z.string().optional(), sources: z.array(numberedSource).optional() }),
  z.object({ role: z.literal('assistant'), content: z.string().nullable(), toolCalls: z.array(toolCall).optional() }),
  z.object({ role: z.literal('tool'), toolCallId: z.string(), name: z.string(), content: z.string(), sources: z.array(numberedSource).optional() }),
]);
const tallySchema = z.object({
  modelCalls: z.number(),
  toolCalls: z.number(),
  inputTokens: z.number(),
  outputTokens: z.number(),
  usd: z.number(),
  wastedModelCalls: z.number(),
  wastedToolCalls: z.number(),
  wastedInputTokens: z.number(),
  wastedOutputTokens: z.number(),
  wastedUsd: z.number(),
});
export const storedTranscriptSchema = z.object({
  generation: z.number().int().nonnegative(),
  messages: z.array(chatMessage),
  attempts: z.object({ warm: z.number().int().nonnegative(), cold: z.number().int().nonnegative() }),
  tally: tallySchema,
});

/** Firestore drops `undefined`; the transcript is stored without optional fields that are unset. */
function storable(transcript: StoredTranscript): unknown {
  return JSON.parse(JSON.stringify(transcript)) as unknown;
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

export async function runAgentSection<TInput>(
  context: StepContext<TInput>,
  deps: ResearchDeps,
  spec: SectionSpec,
): Promise<SectionOutcome | ProviderWait> {
  const nowMs = context.clock.now();
  const stepCircuit = circuitForStep(context.signal, deps.circuit);
  const circuit = await stepCircuit.check(nowMs);
  if (circuit.open && circuit.untilMs !== null) {
    return { kind: 'provider-wait', untilMs: circuit.untilMs, question: `Provider ${deps.provider.name} unavailable; resuming automatically` };
  }
  try {
    const outcome = await runSection(spec, {
      provider: deps.provider,
      toolbox: deps.toolbox.forJob?.(context.jobId) ?? deps.toolbox,
      signal: context.signal,
      random: context.random,
      remainingMs: () => context.remainingMs(),
      ...(deps.policy ? { policy: deps.policy } : {}),
      ...(deps.timers ? { timers: deps.timers } : {}),
      transcripts: {
        load: async (sectionId) => {
          const stored = await context.loadTranscript(sectionId);
          if (stored === null) return null;
          const parsed = storedTranscriptSchema.safeParse(stored);
          if (parsed.success) return parsed.data as StoredTranscript;
          // Refused, not trusted: the section starts a clean thread.
          context.note('transcript-refused', `${spec.sectionId}: stored transcript failed validation; starting a clean thread`);
          return null;
        },
        save: (sectionId, transcript) => context.saveTranscript(sectionId, storable(transcript)),
      },
      onUsage: (entry) => context.addCost(costIncrements(entry)),
      onDraft: (text) => context.showDraft(spec.sectionId, text),
      spend: context.spend,
    });
    if (outcome.kind === 'out-of-time') {
      context.note('section-yielded', `${spec.sectionId}: the step's time ran out mid-section (${outcome.reason}); its transcript is saved and the next step goes on`);
    } else {
      await stepCircuit.succeeded(context.clock.now());
    }
    return outcome;
  } catch (error) {
    if (!isProviderOutage(error) || context.signal.aborted) throw error;
    const nowMs = context.clock.now();
    const state = await stepCircuit.outage(nowMs, describeError(error));
    const asked = capServerDelay(error instanceof PhaselineError ? error.retryAfterMs : undefined, context.limits.maxServerDelayMs);
    if (asked.capped) {
      // Not honoured as a backoff (a day, a century): an outage with a stated resume time.
      const untilMs = Math.max(nowMs + asked.delayMs, state.open && state.untilMs !== null ? state.untilMs : 0);
      return { kind: 'provider-wait', untilMs, question: overLongDelayQuestion(deps.provider.name, asked.requestedMs, asked.delayMs, untilMs) };
    }
    if (state.open && state.untilMs !== null) {
      return { kind: 'provider-wait', untilMs: state.untilMs, question: `Provider ${deps.provider.name} unavailable (${describeError(error)}); resuming automatically` };
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
