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
  /**
   * Leaves one section to be written behind the work (first write wins: one recorded already stays
   * as it is). It lands before any later write of the step, before what is reported after it
   * (`afterWrites`) and before the step's end (`drain`); if it fails, the step fails with it. The
   * promise says when it landed; the step goes on without waiting for it where it can.
   */
  writeSection(section: SectionRecord): Promise<void>;
  loadTranscript(sectionId: string): Promise<unknown>;
  /** Saves a transcript, after the writes left behind; resolves once it is durable. */
  saveTranscript(sectionId: string, transcript: unknown): Promise<void>;
  /** Leaves a transcript's save to be written behind the work, like `writeSection`. */
  saveTranscriptBehind(sectionId: string, transcript: unknown): void;
  /** A write the step meant to leave behind could not even be made (its data refused): the step fails with it, as with a write that failed. */
  refuse(error: unknown): void;
  /** Runs `report` once the writes left behind so far landed (at once when none is in flight); never when one failed. */
  afterWrites(report: () => void): void;
  /** Resolves once every write left behind landed; rejects with the first that failed. */
  drain(): Promise<void>;
  readonly effects: EffectLedger;
}

export function noDurableWrites(who: string): DurableWrites {
  const refusal = () => new Error(`${who} records no sections or transcripts`);
  const refuse = () => Promise.reject(refusal());
  const refuseNow = (): never => {
    throw refusal();
  };
  return {
    writeSection: refuse,
    loadTranscript: refuse,
    saveTranscript: refuse,
    saveTranscriptBehind: refuseNow,
    refuse: (error) => {
      throw error;
    },
    afterWrites: (report) => report(),
    drain: () => Promise.resolve(),
    effects: refusingEffectLedger(who),
  };
}

/** Share of the step budget after which a phase should stop starting new sections. */
const YIELD_AT_BUDGET_SHARE = 0.8;

export function createStepContext<TInput>(parts: ContextParts<TInput>): StepContext<TInput> {
  const progressed = () => parts.onProgress?.();
  const claimSignal = parts.claimSignal ?? parts.signal;
  const needs = new Set([...(parts.phase.needs ?? []).map((phase) => phase.name)]);
  /** Each section this step recorded, by ID: the record's landing (sections loaded from the store are on record already). */
  const landings = new Map<string, Promise<void>>();
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
    recordSection(id, data) {
      // The same ID again is the same record: its caller waits for that record's own landing, never for less.
      const earlier = landings.get(id);
      if (earlier !== undefined) return earlier;
      const recording = (async () => {
        claimSignal.throwIfAborted();
        if (parts.sections.some((section) => section.id === id)) return;
        let validated: unknown;
        try {
          validated = parts.phase.section ? parts.phase.section.parse(data) : data;
        } catch (error) {
          // A phase that does not wait for the record fails all the same: the refusal is the step's failure.
          parts.durable.refuse(error);
          throw error;
        }
        const section: SectionRecord = {
          id,
          phase: parts.phase.name,
          unit: parts.unit,
          data: validated,
          seq: parts.sections.length,
          recordedAtMs: parts.clock.now(),
          version: phaseVersion(parts.phase),
        };
        // Written behind the work: a phase that does not wait for it goes on (its next model call) while it commits.
        const landed = parts.durable.writeSection(section);
        parts.sections.push(section);
        progressed();
        await landed;
      })();
      // The engine sees its failure whether or not the phase waits for it (the step fails): never an unhandled rejection.
      recording.catch(() => undefined);
      landings.set(id, recording);
      return recording;
    },
    loadTranscript: (sectionId) => parts.durable.loadTranscript(sectionId),
    saveTranscript: async (sectionId, transcript) => {
      claimSignal.throwIfAborted();
      await parts.durable.saveTranscript(sectionId, transcript);
      progressed();
    },
    saveTranscriptBehind: (sectionId, transcript) => {
      claimSignal.throwIfAborted();
      parts.durable.saveTranscriptBehind(sectionId, transcript);
      progressed();
    },
    // Progress and notes reach the job only once the writes left before them landed: nothing is reported done before it is durable.
    reportProgress: (values) => {
      progressed();
      parts.durable.afterWrites(() => parts.flusher?.reportProgress(values));
    },
    addCost: (increments) => {
      progressed();
      parts.flusher?.addCost(increments);
    },
    note: (kind, message) => {
      progressed();
      parts.durable.afterWrites(() => parts.flusher?.note(kind, message));
    },
    showDraft: (sectionId, text) => parts.drafts?.show(sectionId, text),
    shouldYield: () => parts.clock.now() >= parts.deadlineMs - parts.budgetMs * (1 - YIELD_AT_BUDGET_SHARE),
    remainingMs: () => Math.max(0, parts.deadlineMs - parts.clock.now()),
    limits: parts.limits,
    effects: parts.durable.effects,
    spend: parts.spend ?? UNMETERED,
  };
}
