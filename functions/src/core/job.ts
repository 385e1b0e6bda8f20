/** The job as the core sees it: plain data, times in epoch milliseconds, no Firebase types. */
import type { EffectCounts } from './effect-ledger';
import type { ClaimTally } from './flusher';

export const JOB_STATUSES = ['queued', 'running', 'waiting', 'completed', 'failed', 'cancelled', 'quarantined'] as const;
export type JobStatus = (typeof JOB_STATUSES)[number];

export const TERMINAL_STATUSES: ReadonlySet<JobStatus> = new Set(['completed', 'failed', 'cancelled', 'quarantined']);

/**
 * Statuses a job never leaves. Quarantined is terminal for the engine but not ended: an operator
 * may release it, so its timeline and transcripts are kept until it ends for good.
 */
export const ENDED_STATUSES: ReadonlySet<JobStatus> = new Set(['completed', 'failed', 'cancelled']);

export type JobOutcome = 'complete' | 'partial';

/**
 * An ended job's retention stamping still to do: its transcripts, events and artifacts get
 * `expireAt` from the sweeper (engine/retention.ts), in bounded pages. `dueAtMs` is when the job
 * ended (the sweeper's query range); `cursor` is where the last sweep stopped (`collection/docId`
 * inside the job), null to start from the beginning.
 */
export interface RetentionStamping {
  readonly dueAtMs: number;
  readonly cursor: string | null;
}

export interface Lease {
  /** The fencing epoch of the claim that holds this lease. */
  readonly epoch: number;
  /** Who holds it, for people reading the document; never used for ownership checks. */
  readonly worker: string;
  readonly expiresAtMs: number;
  /** The last renewal (claim or heartbeat); absent on leases written before it was recorded. */
  readonly renewedAtMs?: number;
}

/** The last caught error a job or a unit recorded. */
export interface RecordedError {
  readonly code: string;
  readonly message: string;
  readonly atMs: number;
}

export interface JobError extends RecordedError {
  readonly retryable: boolean;
}

/**
 * The lease-holding part of a job and of a fan-out unit: what a claim, a take-over, a reclaim, a
 * give-back and a re-dispatch read and change (core/lease-holder.ts). Declared once, because a unit
 * is claimed like a job.
 */
export interface LeaseHolder<TStatus extends string = string, TError extends RecordedError = RecordedError> {
  readonly status: TStatus;
  /** Fencing epoch: incremented by every claim. */
  readonly epoch: number;
  readonly lease: Lease | null;
  /** Hand-offs so far; with the epoch and dispatch count it names the next task. */
  readonly step: number;
  /** Times the sweeper re-dispatched the current step because its task went missing. */
  readonly dispatch: number;
  /** Caught errors so far (the retry budget). */
  readonly attempts: number;
  /** Workers lost without progress so far (the poison budget). */
  readonly staleReclaims: number;
  readonly nextRunAtMs: number;
  readonly progress: Readonly<Record<string, number>>;
  readonly cost: Readonly<Record<string, number>>;
  readonly lastError: TError | null;
  /** What the current claim already recorded (running cost, notes), so retried writes add nothing twice. */
  readonly claimTally: ClaimTally | null;
  readonly updatedAtMs: number;
}

/** Why a job waits (JobWait.reason): the readers that validate a job document take this list, so a new reason reaches all of them. */
export const WAIT_REASONS = ['decision', 'provider', 'budget'] as const;

export interface JobWait {
  /**
   * `decision`: a person must answer; `provider`: a dependency is down and the job resumes by
   * itself; `budget`: the owner's daily model spend reached its cap, and the job resumes by itself
   * when the day ends, or sooner when its owner answers (after an operator raised the cap).
   */
  readonly reason: (typeof WAIT_REASONS)[number];
  /** Names the question, so an answer is filed under it and a stale answer is refused. */
  readonly questionId: string;
  readonly question: string;
  readonly options: readonly string[];
  /** When the sweeper requeues the job by itself; null waits for a person, however long. */
  readonly untilMs: number | null;
}

export interface FanOutState {
  readonly phase: string;
  /** The job epoch the fan-out was started under. */
  readonly epoch: number;
  readonly units: number;
  readonly done: number;
  /**
   * The fan-out's unit IDs, so that the commit that ends it early (cancel, failure, wait,
   * quarantine) can revoke every unit's claim in that same commit. Absent on fan-outs recorded
   * before it existed.
   */
  readonly unitIds?: readonly string[];
}

export interface JobRecord extends LeaseHolder<JobStatus, JobError> {
  readonly id: string;
  readonly owner: string;
  readonly pipeline: string;
  readonly input: unknown;
  readonly conversationId: string | null;
  readonly idempotencyKey: string | null;
  readonly outcome: JobOutcome | null;
  /** The phase the job was last working on or handed off to: advisory on resume. */
  readonly phase: string | null;
  readonly waiting: JobWait | null;
  readonly quarantine: { readonly reason: string; readonly atMs: number } | null;
  /** Answers people gave, by question ID; phases read them through their context. */
  readonly decisions: Readonly<Record<string, string>>;
  /** Set when the job was cancelled: when, by whom, why, and what the job had done by then. */
  readonly cancellation: Cancellation | null;
  /**
   * When the sweeper next checks this job's effect ledger against the system of record, once the
   * job has stopped (cancelled, failed, quarantined); null or absent when nothing is left to check.
   * Set when an effect is first sent and by a cancel, cleared once no entry is `applying` or
   * `unknown` (engine/settle-stopped.ts). Meaningless while the job runs or after it completed.
   */
  readonly effectsToSettleAtMs?: number | null;
  /** Set by the commit that ends the job, cleared once every expiring child document carries `expireAt`. */
  readonly retention?: RetentionStamping | null;
  readonly fanout: FanOutState | null;
  readonly eventSeq: number;
  readonly createdAtMs: number;
  readonly finishedAtMs: number | null;
  /**
   * The version of its pipeline the job was submitted on (`PipelineDefinition.version`). A job
   * written before versions existed reads as 1 (every pipeline was at version 1 until then); null
   * when whoever created it did not say (a tool writing jobs without submit's validation). What a
   * worker may read is decided per checkpoint and section, by the version that wrote each
   * (core/versions.ts); this records where the job started.
   */
  readonly pipelineVersion?: number | null;
  /** The last re-drive an operator made of this job (engine/operator.ts), or null/absent if none. */
  readonly redrive?: JobRedrive | null;
}

/** An operator's re-drive: the job restarted from a phase, its later state set aside for audit. */
export interface JobRedrive {
  /** Re-drives of this job so far, this one included; it numbers what each set aside. */
  readonly count: number;
  readonly fromPhase: string;
  /** Who re-drove it, and why, as the operator said. */
  readonly by: string;
  readonly reason: string;
  readonly atMs: number;
  /** The status the job had when it was re-driven. */
  readonly previousStatus: JobStatus;
  /** Documents set aside (under `jobs/{id}/setAside`, IDs starting with `auditPrefix`). */
  readonly setAside: number;
  readonly auditPrefix: string;
}

/** What a job is asked to do, and by whom: the fields a submit sets. */
export type JobRequest = Pick<JobRecord, 'id' | 'owner' | 'pipeline' | 'input' | 'conversationId' | 'idempotencyKey' | 'pipelineVersion'>;

/** A job as it is first written: queued for step 0, due at once, its `submitted` event the first in its timeline. */
export function newQueuedJob(request: JobRequest, nowMs: number): JobRecord {
  return {
    ...request,
    status: 'queued',
    outcome: null,
    phase: null,
    epoch: 0,
    lease: null,
    step: 0,
    dispatch: 0,
    attempts: 0,
    staleReclaims: 0,
    nextRunAtMs: nowMs,
    progress: {},
    cost: {},
    lastError: null,
    waiting: null,
    quarantine: null,
    decisions: {},
    cancellation: null,
    retention: null,
    fanout: null,
    claimTally: null,
    eventSeq: 1,
    createdAtMs: nowMs,
    updatedAtMs: nowMs,
    finishedAtMs: null,
    pipelineVersion: request.pipelineVersion ?? null,
    redrive: null,
  };
}

/** A stopped job's effect ledger, counted by entry state (see effect-ledger.ts). */
export interface StoppedEffects {
  readonly counts: EffectCounts;
  /** No entry is `applying` or `unknown`: the counts are final. */
  readonly settled: boolean;
  /** The system of record the ledger was last checked with, and when; null until the first check. */
  readonly checkedWith: string | null;
  readonly checkedAtMs: number | null;
}

/** A cancel (the owner's, or an operator's on the owner's behalf), as structured fields; rendered to words where shown (effects/stop-report.ts). */
export interface Cancellation {
  readonly atMs: number;
  readonly reason: string;
  /** The operator who cancelled; null when the owner did. */
  readonly by: string | null;
  /** The phase the job was in, or null before its first step. */
  readonly phase: string | null;
  /** Sections finished, for pipelines that count them. */
  readonly sectionsDone: number | null;
  /** Null when the job had no effect ledger. */
  readonly effects: StoppedEffects | null;
}

export const UNIT_STATUSES = ['queued', 'running', 'done'] as const;
export type UnitStatus = (typeof UNIT_STATUSES)[number];

export interface UnitRecord extends LeaseHolder<UnitStatus> {
  readonly jobId: string;
  readonly unit: string;
  readonly phase: string;
  /** The job epoch of the fan-out this unit belongs to. */
  readonly fanoutEpoch: number;
  /** The part of `cost` already added to the job's cost: each unit's cost is counted once. */
  readonly costInJob: Readonly<Record<string, number>>;
  readonly result: unknown;
  /** The version of its phase that produced `result` (core/versions.ts); absent on results from before versions existed (version 1). */
  readonly resultVersion?: number;
}

/** What a task carries. Everything else is read from the job document. */
export interface StepTask {
  readonly jobId: string;
  readonly step: number;
  /** Set for a fan-out unit's task, with the phase it belongs to (units are keyed by both). */
  readonly unit?: string;
  readonly phase?: string;
}

/** Deterministic, so that enqueuing the same hand-off twice is harmless (Cloud Tasks dedups by name). */
export function stepTaskId(jobId: string, step: number, dispatch: number): string {
  return `${jobId}-s${step}-d${dispatch}`;
}

export function unitTaskId(jobId: string, fanoutEpoch: number, unit: string, step: number, dispatch: number): string {
  return `${jobId}-e${fanoutEpoch}-u${unit.replace(/[^A-Za-z0-9_-]/g, '_')}-s${step}-d${dispatch}`;
}
