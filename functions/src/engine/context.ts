/** The StepContext a phase or unit sees, built over the flusher and an owner-checked section writer. */
import type { Clock, RandomSource } from '../core/clock';
import type { DraftThrottle } from '../core/draft-throttle';
import type { CoalescingFlusher } from '../core/flusher';
import { UNMETERED, type PhaseDefinition, type SectionRecord, type SpendMeter, type StepContext, type StepLimits } from '../core/pipeline';
import { phaseVersion } from '../core/versions';
import { refusingEffectLedger, type EffectLedger } from '../effects/ledger';

export interface ContextParts<TInput> {
  readonly jobId: string;
  readonly input: TInput;
  readonly unit: string | null;
  readonly decisions: Readonly<Record<string, string>>;
  /** The signal the phase's calls get (StepContext.signal). */
  readonly signal: AbortSignal;
  /** The claim's own signal, which the context's writes check; without it, `signal`. */
  readonly claimSignal?: AbortSignal;
  readonly clock: Clock;
  readonly random: RandomSource;
  readonly phase: PhaseDefinition<TInput, unknown>;
  readonly states: ReadonlyMap<string, unknown>;
  readonly sections: SectionRecord[];
  readonly flusher: CoalescingFlusher | null;
  readonly deadlineMs: number;
  readonly budgetMs: number;
  readonly durable: DurableWrites;
  readonly limits: StepLimits;
  /** Told whenever the step shows progress (something recorded or reported): it keeps the lease alive. */
  readonly onProgress?: () => void;
  /** Where drafts of sections in flight go; none for contexts that run no sections. */
  readonly drafts?: DraftThrottle | null;
  /** The owner's spend cap; none (unmetered) for contexts that make no model calls. */
  readonly spend?: SpendMeter;
}

/** The owner-checked writes a context can make; absent for coordinator, join and publish contexts. */
export interface DurableWrites {
  /** Writes one section durably; resolves false when it was recorded already. */
  writeSection(section: SectionRecord): Promise<boolean>;
  loadTranscript(sectionId: string): Promise<unknown>;
  saveTranscript(sectionId: string, transcript: unknown): Promise<void>;
  readonly effects: EffectLedger;
}

export function noDurableWrites(who: string): DurableWrites {
  const refuse = () => Promise.reject(new Error(`${who} records no sections or transcripts`));
  return { writeSection: refuse, loadTranscript: refuse, saveTranscript: refuse, effects: refusingEffectLedger(who) };
}

/** Share of the step budget after which a phase should stop starting new sections. */
const YIELD_AT_BUDGET_SHARE = 0.8;

export function createStepContext<TInput>(parts: ContextParts<TInput>): StepContext<TInput> {
  const progressed = () => parts.onProgress?.();
  const claimSignal = parts.claimSignal ?? parts.signal;
  const needs = new Set([...(parts.phase.needs ?? []).map((phase) => phase.name)]);
  return {
    jobId: parts.jobId,
    input: parts.input,
    signal: parts.signal,
    clock: parts.clock,
    random: parts.random,
    phase: parts.phase.name,
    unit: parts.unit,
    decisions: parts.decisions,
    checkpoint<TState>(phase: PhaseDefinition<TInput, TState>): TState {
      if (!needs.has(phase.name)) throw new Error(`Phase ${parts.phase.name} reads ${phase.name} without declaring it in needs`);
      if (!parts.states.has(phase.name)) throw new Error(`Phase ${parts.phase.name} needs ${phase.name}, which has no valid checkpoint`);
      return parts.states.get(phase.name) as TState;
    },
    sections: () => parts.sections,
    async recordSection(id, data) {
      claimSignal.throwIfAborted();
      if (parts.sections.some((section) => section.id === id)) return;
      const validated = parts.phase.section ? parts.phase.section.parse(data) : data;
      const section: SectionRecord = {
        id,
        phase: parts.phase.name,
        unit: parts.unit,
        data: validated,
        seq: parts.sections.length,
        recordedAtMs: parts.clock.now(),
        version: phaseVersion(parts.phase),
      };
      await parts.durable.writeSection(section);
      parts.sections.push(section);
      progressed();
    },
    loadTranscript: (sectionId) => parts.durable.loadTranscript(sectionId),
    saveTranscript: async (sectionId, transcript) => {
      claimSignal.throwIfAborted();
      await parts.durable.saveTranscript(sectionId, transcript);
      progressed();
    },
    reportProgress: (values) => {
      progressed();
      parts.flusher?.reportProgress(values);
    },
    addCost: (increments) => {
      progressed();
      parts.flusher?.addCost(increments);
    },
    note: (kind, message) => {
      progressed();
      parts.flusher?.note(kind, message);
    },
    showDraft: (sectionId, text) => parts.drafts?.show(sectionId, text),
    shouldYield: () => parts.clock.now() >= parts.deadlineMs - parts.budgetMs * (1 - YIELD_AT_BUDGET_SHARE),
    remainingMs: () => Math.max(0, parts.deadlineMs - parts.clock.now()),
    limits: parts.limits,
    effects: parts.durable.effects,
    spend: parts.spend ?? UNMETERED,
  };
}
