/**
 * How a pipeline is defined: named phases, each with a zod schema for the semantic state it
 * checkpoints, the phases whose state it needs, and either a `run` for one bounded step or a
 * fan-out into units that run as separate tasks with their own leases and join exactly once.
 */
import type { z } from 'zod';
import type { EffectLedger } from './effect-ledger';
import type { Clock, RandomSource } from './clock';

/** A durably recorded section: the checkpoint grain of a phase that writes in sections. */
export interface SectionRecord<TData = unknown> {
  /** The pipeline's own section ID, unique within its phase and unit. */
  readonly id: string;
  readonly phase: string;
  readonly unit: string | null;
  readonly data: TData;
  /** Order of recording within the phase and unit. */
  readonly seq: number;
  readonly recordedAtMs: number;
  /** The version of the phase that recorded it (core/versions.ts); absent on sections recorded before versions existed. */
  readonly version?: number;
}

/** What a phase step runs with: the input, the checkpoints it needs, sections, transcripts, the effect ledger, decisions, and the claim signal. */
export interface StepContext<TInput> {
  readonly jobId: string;
  readonly input: TInput;
  /**
   * Aborted when this worker loses its claim (or the job is cancelled), and when it has confirmed no
   * lease renewal for the stale-takeover age less the clock-skew allowance (a worker woken from a
   * freeze): pass it to every call, and check it before starting one.
   */
  readonly signal: AbortSignal;
  readonly clock: Clock;
  readonly random: RandomSource;
  /** The name of the phase this step runs. */
  readonly phase: string;
  /** The unit this step runs, inside a fan-out. */
  readonly unit: string | null;
  /** Answers a person gave to earlier questions, by question ID. */
  readonly decisions: Readonly<Record<string, string>>;
  /** The validated checkpoint of an earlier phase this phase declared in `needs`. */
  checkpoint<TState>(phase: PhaseDefinition<TInput, TState>): TState;
  /** Sections recorded by this phase (and unit), in recording order: those this step recorded are on record by its end. */
  sections(): readonly SectionRecord[];
  /**
   * Records a finished section: owner-checked, resolves once it is durable, rejects if it cannot be
   * (this worker no longer owns the claim, the write failed). A phase need not wait for it: the
   * engine keeps it on record before any later write of the step, before progress or notes reported
   * after it reach the job, and before the step ends, and a record that cannot be written fails the
   * step (nothing after it lands). So `void context.recordSection(...)` starts the next section's
   * model call while the record commits; `sections()` includes it at once.
   */
  recordSection(id: string, data: unknown): Promise<void>;
  /** Absolute progress figures (counts); coalesced into at most about one job write a second. */
  reportProgress(values: Readonly<Record<string, number>>): void;
  /** Money or calls spent, as increments; also coalesced. */
  addCost(increments: Readonly<Record<string, number>>): void;
  /** The persisted working state (a tool-calling transcript) of a section in flight, or null. */
  loadTranscript(sectionId: string): Promise<unknown>;
  /** Persists a section's working state. Owner-checked; throws if this worker no longer owns the claim. */
  saveTranscript(sectionId: string, transcript: unknown): Promise<void>;
  /**
   * Persists a section's working state behind the work, as `recordSection` writes a section: the
   * step goes on at once, and the save is on record before any later write of the step and its end.
   * Absent where nothing is written behind (then `saveTranscript`).
   */
  saveTranscriptBehind?(sectionId: string, transcript: unknown): void;
  /** Appends a line to the job's timeline with the next coalesced write. */
  note(kind: string, message: string): void;
  /**
   * Shows the text of a section in flight as it is written (at most about one write a second per
   * section, never through the job document). A view only: nothing durable depends on it.
   */
  showDraft(sectionId: string, text: string): void;
  /** True once most of this step's time budget is used: finish the section at hand, then yield. */
  shouldYield(): boolean;
  /**
   * Milliseconds left before this step must have ended (its hard deadline, well inside the
   * function timeout). Bound every call's timeout and retries by it; Infinity where no step runs.
   */
  remainingMs(): number;
  /** Engine limits a phase applies to advice from outside. */
  readonly limits: StepLimits;
  /** The job's effect ledger (inside a unit: that unit's entries). Every write is owner-checked. */
  readonly effects: EffectLedger;
  /** The owner's daily model spend: ask before every model call, charge every call that cost something. */
  readonly spend: SpendMeter;
}

/**
 * The owner's daily model spend cap as a step sees it. The check reads what every worker of the
 * owner charged, so the cap is passed by at most one call per worker: the one running, or about to
 * start on a check already read, when it was reached.
 */
export interface SpendMeter {
  /** Throws SpendLimitReachedError when the owner's spend today reached their cap: start no call then. */
  beforeCall(): Promise<void>;
  /** Charges one call's cost (its answer used or thrown away) to the owner's day. */
  charge(usd: number): void;
  /**
   * Starts reading the next call's check now, so that the call does not wait for it: call it when a
   * model call is sure to follow (after an answer whose tool calls run first, at a section's start).
   * The next `beforeCall` decides on that read unless something was charged since.
   */
  readAhead?(): void;
}

/** No cap: for contexts that make no model calls, and for tests. */
export const UNMETERED: SpendMeter = { beforeCall: () => Promise.resolve(), charge: () => undefined };

/** Engine limits a step applies to advice from outside. */
export interface StepLimits {
  /** Cap on a server-given delay (Retry-After); a longer one is an outage resumed at this distance. */
  readonly maxServerDelayMs: number;
}

/** A person must answer; no timeout, so a question never times out into a default. */
export interface DecisionWait {
  readonly kind: 'wait';
  readonly reason: 'decision';
  readonly questionId: string;
  readonly question: string;
  readonly options: readonly string[];
}

/** A dependency is down; the job resumes by itself at `untilMs` (required), nobody answers it. */
export interface ProviderWait {
  readonly kind: 'wait';
  readonly reason: 'provider';
  readonly questionId: string;
  readonly question: string;
  readonly untilMs: number;
}

/** What one step of a phase ends with: done (its checkpoint), yield (more to do), or a wait for a person or a provider. */
export type PhaseOutcome<TState> =
  | { readonly kind: 'done'; readonly state: TState }
  /**
   * More to do; what is finished is recorded in sections. A fresh task continues, not before
   * `untilMs` when given (something the next step needs is not settled before then).
   */
  | { readonly kind: 'yield'; readonly untilMs?: number }
  | DecisionWait
  | ProviderWait;

/** What one step of a fan-out unit ends with: done (its result), yield, or a provider wait for the whole job. */
export type UnitOutcome<TUnitState> =
  | { readonly kind: 'done'; readonly state: TUnitState }
  | { readonly kind: 'yield' }
  /**
   * A dependency is down for everyone (the provider circuit is open): the whole job waits until
   * `untilMs`, then the fan-out restarts, reusing finished units and recorded sections.
   */
  | { readonly kind: 'wait'; readonly reason: 'provider'; readonly question: string; readonly untilMs: number };

/** A phase split into units, each run as its own task with its own lease, joined once after the last. */
export interface FanOut<TInput, TState, TUnitState> {
  /** Unit IDs, derived deterministically from earlier checkpoints. */
  units(context: StepContext<TInput>): readonly string[];
  readonly unitState: z.ZodType<TUnitState>;
  runUnit(context: StepContext<TInput>, unit: string): Promise<UnitOutcome<TUnitState>>;
  /** Combines the finished units into the phase's checkpoint; called once, after the last unit. */
  join(results: ReadonlyMap<string, TUnitState>, context: StepContext<TInput>): TState;
}

/** A named phase: the schema of its checkpoint, the phases it needs, and either `run` or `fanOut`. */
export interface PhaseDefinition<TInput, TState> {
  readonly name: string;
  /** Schema of the checkpoint this phase writes; parsed on write and on every read. */
  readonly state: z.ZodType<TState>;
  /** Schema of one recorded section's data, when the phase records sections. */
  readonly section?: z.ZodType;
  /** Earlier phases whose checkpoints this one reads. Resume never starts a phase whose needs are missing. */
  readonly needs?: readonly PhaseDefinition<TInput, unknown>[];
  run?(context: StepContext<TInput>): Promise<PhaseOutcome<TState>>;
  readonly fanOut?: FanOut<TInput, TState, unknown>;
  /**
   * The pipeline version in which this phase's checkpoint, section and unit result schemas took
   * their present form (default 1). Every checkpoint, section and unit result records the version of
   * the phase that wrote it. A deploy that changes one of the schemas raises it to the pipeline's new
   * version and says in `older` how to read what the earlier version wrote (core/versions.ts has the
   * reading rules).
   */
  readonly version?: number;
  /** How this phase reads what an earlier version of it wrote, by that version: a migration, or a refusal with its reason. */
  readonly older?: Readonly<Record<number, OlderVersionReading>>;
}

/**
 * Reads an earlier version's stored data as this version's. Each function gets the stored value as
 * it was written; what it returns is then parsed by the phase's present schema (`state`, `section`,
 * `fanOut.unitState`), so a migration cannot smuggle in a value the phase would not write itself.
 */
export interface PhaseMigration {
  readonly state?: (old: unknown) => unknown;
  readonly section?: (old: unknown) => unknown;
  /** A fan-out unit's result; without it, a unit whose result that version produced runs again. */
  readonly unitState?: (old: unknown) => unknown;
}

/** This phase cannot read what that version wrote: a job holding such state fails, with this reason. */
export interface PhaseRefusal {
  readonly refuse: string;
}

/** How a phase reads what an earlier version of it wrote: a migration or a refusal. */
export type OlderVersionReading = PhaseMigration | PhaseRefusal;

/** A job's published answer, written with its completion: complete or partial, with what is missing named. */
export interface PublishedResult {
  readonly outcome: 'complete' | 'partial';
  readonly title: string;
  readonly markdown: string;
  /** What is missing from a partial result, by name. */
  readonly missing: readonly string[];
}

/** A pipeline: its name, input schema, phases in order, who may run it, and how its answer is published. */
export interface PipelineDefinition<TInput> {
  readonly name: string;
  readonly description: string;
  /**
   * This definition's version (default 1), recorded on each job at submit (`pipelineVersion`).
   * Raise it with a deploy that changes a phase's checkpoint or section schema (that phase's
   * `version` follows it); jobs in flight across the deploy are read through the phases' `older`.
   */
  readonly version?: number;
  readonly input: z.ZodType<TInput>;
  /** Who may submit this pipeline's jobs (and answer their questions); default `anyone`. See PipelineAccess. */
  readonly access?: PipelineAccess;
  readonly phases: readonly PhaseDefinition<TInput, unknown>[];
  /** Builds the published answer from the final checkpoints; runs inside the completing step. */
  publish(context: StepContext<TInput>): PublishedResult;
}

/**
 * Who may run a pipeline, checked by the functions from the caller's ID token: at submit, and when
 * its owner answers a job's question (an answer makes the job go on; cancelling is always allowed).
 *   - `anyone`: every account, anonymous ones included (their jobs count against the ceiling on
 *     anonymous jobs in flight);
 *   - `signed-in`: accounts that are not anonymous;
 *   - `granted`: signed-in accounts an operator granted the pipeline: its name is listed in their
 *     custom claim PIPELINE_GRANTS_CLAIM (`phaseline admin allow <uid> <pipeline>`, or the admin
 *     SDK's `setCustomUserClaims(uid, { ...claims, phaselinePipelines: ['notify'] })`).
 */
export type PipelineAccess = 'anyone' | 'signed-in' | 'granted';
export const PIPELINE_ACCESS_LEVELS: readonly PipelineAccess[] = ['anyone', 'signed-in', 'granted'];
/** Who may run a pipeline that does not say: `anyone`. */
export const DEFAULT_PIPELINE_ACCESS: PipelineAccess = 'anyone';

/** The custom claim that lists the pipelines an operator granted a user (names; only a list of strings counts). */
export const PIPELINE_GRANTS_CLAIM = 'phaselinePipelines';

/** What the access check knows of a caller, from their ID token. */
export interface PipelineCaller {
  readonly uid: string;
  readonly anonymous: boolean;
  /** The pipelines named in the caller's PIPELINE_GRANTS_CLAIM. */
  readonly grantedPipelines: ReadonlySet<string>;
}

/** The pipelines a token's claims grant: PIPELINE_GRANTS_CLAIM's strings, nothing for any other value. */
export function grantedPipelinesOf(claims: Readonly<Record<string, unknown>> | undefined): ReadonlySet<string> {
  const granted = claims?.[PIPELINE_GRANTS_CLAIM];
  return new Set(Array.isArray(granted) ? granted.filter((name): name is string => typeof name === 'string') : []);
}

/** Why `caller` may not run `pipeline` (a sentence for them), or null when they may. */
export function pipelineAccessRefusal(pipeline: Pick<PipelineDefinition<unknown>, 'name' | 'access'>, caller: PipelineCaller): string | null {
  const access = pipeline.access ?? DEFAULT_PIPELINE_ACCESS;
  if (access === 'anyone') return null;
  if (caller.anonymous) return `Pipeline "${pipeline.name}" is not open to guest (anonymous) accounts: sign in with an account${access === 'granted' ? ' an operator has granted it to' : ''}.`;
  if (access === 'granted' && !caller.grantedPipelines.has(pipeline.name)) {
    return `Pipeline "${pipeline.name}" needs an operator's grant: ask an operator to grant it to user ${caller.uid} (phaseline admin allow ${caller.uid} ${pipeline.name}), then sign in again for a new ID token.`;
  }
  return null;
}

/** Phase names: kebab-case, short enough to sit in unit keys and task payloads. One rule, used everywhere. */
export const PHASE_NAME_PATTERN = /^[a-z][a-z0-9-]{0,63}$/;

/** Identity helpers that keep each phase's state type while the pipeline stores them together. */
export function definePhase<TInput, TState>(phase: PhaseDefinition<TInput, TState>): PhaseDefinition<TInput, TState> {
  return phase;
}

/** Defines a phase that fans out into units (keeps its unit result type). */
export function defineFanOutPhase<TInput, TState, TUnitState>(
  phase: Omit<PhaseDefinition<TInput, TState>, 'run' | 'fanOut'> & { readonly fanOut: FanOut<TInput, TState, TUnitState> },
): PhaseDefinition<TInput, TState> {
  return phase;
}

/** Defines a pipeline, checked: unique kebab-case phase names, each with one of run or fanOut, needs only on earlier phases, valid versions and access. */
export function definePipeline<TInput>(pipeline: PipelineDefinition<TInput>): PipelineDefinition<TInput> {
  const names = new Set<string>();
  const version = pipeline.version ?? 1;
  if (!Number.isInteger(version) || version < 1) throw new Error(`Pipeline ${pipeline.name}: version must be a whole number from 1, not ${String(version)}`);
  if (pipeline.access !== undefined && !PIPELINE_ACCESS_LEVELS.includes(pipeline.access)) {
    throw new Error(`Pipeline ${pipeline.name}: access must be one of ${PIPELINE_ACCESS_LEVELS.join(', ')}, not ${pipeline.access}`);
  }
  for (const phase of pipeline.phases) {
    const problem = phaseVersionProblem(phase, version);
    if (problem !== null) throw new Error(`Pipeline ${pipeline.name}: phase ${phase.name} ${problem}`);
    if (names.has(phase.name)) throw new Error(`Pipeline ${pipeline.name}: phase ${phase.name} is defined twice`);
    if (!PHASE_NAME_PATTERN.test(phase.name)) throw new Error(`Pipeline ${pipeline.name}: phase name ${phase.name} must be kebab-case, at most 64 characters`);
    if ((phase.run === undefined) === (phase.fanOut === undefined)) {
      throw new Error(`Pipeline ${pipeline.name}: phase ${phase.name} needs exactly one of run or fanOut`);
    }
    for (const need of phase.needs ?? []) {
      if (!names.has(need.name)) throw new Error(`Pipeline ${pipeline.name}: phase ${phase.name} needs ${need.name}, which does not come before it`);
    }
    names.add(phase.name);
  }
  return pipeline;
}

/** What is wrong with a phase's version declarations, for a pipeline at `pipelineVersion`; null when nothing is. */
export function phaseVersionProblem(phase: Pick<PhaseDefinition<unknown, unknown>, 'version' | 'older'>, pipelineVersion: number): string | null {
  const version = phase.version ?? 1;
  if (!Number.isInteger(version) || version < 1 || version > pipelineVersion) {
    return `has version ${String(version)}: a phase's version is a whole number from 1 to its pipeline's version (${pipelineVersion})`;
  }
  for (const [key, reading] of Object.entries(phase.older ?? {})) {
    const from = Number(key);
    if (!Number.isInteger(from) || from < 1 || from >= version) return `declares how to read version ${key}, which is not an earlier version of it (1 to ${version - 1})`;
    const refuses = 'refuse' in reading;
    const migrates = 'state' in reading || 'section' in reading || 'unitState' in reading;
    if (refuses === migrates) return `must either migrate or refuse what version ${key} wrote, not ${refuses ? 'both' : 'neither'}`;
    if (refuses && reading.refuse.trim() === '') return `refuses version ${key} without a reason`;
  }
  return null;
}

/** Pipelines by name; the submit endpoint validates input against the named one. */
export type PipelineRegistry = ReadonlyMap<string, PipelineDefinition<unknown>>;

/** Pipelines by name, as the engine, the handlers and the tools look them up. */
export function pipelineRegistry<TInputs extends readonly unknown[]>(...pipelines: { readonly [K in keyof TInputs]: PipelineDefinition<TInputs[K]> }): PipelineRegistry {
  // Each pipeline parses its own input before any phase sees it, so erasing the input type here is safe.
  return new Map(pipelines.map((pipeline) => [pipeline.name, pipeline]));
}

/**
 * The phase to run: the earliest one without a valid checkpoint. The phase named in the job
 * document is only a hint; stored state decides, so a missing or refused checkpoint is redone.
 */
export function resumePhaseIndex<TInput>(pipeline: PipelineDefinition<TInput>, validCheckpoints: ReadonlySet<string>): number {
  const index = pipeline.phases.findIndex((phase) => !validCheckpoints.has(phase.name));
  return index === -1 ? pipeline.phases.length : index;
}
