/**
 * What the invariant checker reads: plain data collected from Firestore (with Firestore's own
 * commit times) and from the receiver, and what the client recorded about its submissions. No
 * Firebase types here, so the checker is tested with synthetic documents.
 *
 * Commit times are microseconds since 1970 as Firestore assigns them (`updateTime`, `createTime`):
 * one clock, the database's, in commit order. Times the engine writes into documents (`atMs`,
 * `recordedAtMs`) come from each worker's clock before its commit and are not used for ordering.
 * The one exception is the offline toolbox's execution log (ToolExecution): it has no commit time,
 * so its wall-clock start is compared with commit times, both read from this machine's clock.
 */
import type { UnitView } from '../../functions/src/core/invariants';
import type { JobRecord } from '../../functions/src/core/job';

export interface EventDoc {
  readonly id: string;
  readonly kind: string;
  /** The job's epoch when the event was written. */
  readonly epoch: number;
  readonly unit: string | null;
  readonly commitUs: number;
  /** The job's status as of the commit that wrote the event (absent or null when the document has none). */
  readonly status?: string | null;
}

/** A document a claim holder wrote, carrying the writer's fencing epoch. */
export interface OwnedWrite {
  readonly collection: 'sections' | 'checkpoints' | 'transcripts' | 'effects' | 'events';
  readonly id: string;
  /**
   * null: the job's own claim; otherwise the fan-out unit document whose claim (and epoch sequence)
   * it is, named as its document is keyed: `{phase}~{unit}`.
   */
  readonly unit: string | null;
  readonly epoch: number;
  readonly commitUs: number;
}

export interface SectionDoc {
  readonly id: string;
  readonly phase: string;
  readonly unit: string | null;
  readonly sectionId: string;
  readonly epoch: number;
  readonly commitUs: number;
}

export interface CheckpointDoc {
  readonly phase: string;
  readonly epoch: number;
  readonly commitUs: number;
}

export interface TranscriptDoc {
  readonly id: string;
  readonly phase: string;
  readonly unit: string | null;
  readonly sectionId: string;
  readonly epoch: number;
  readonly commitUs: number;
  readonly generation: number;
  readonly wastedModelCalls: number;
  readonly modelCalls: number;
  /** The tool call IDs whose results this (final) version of the transcript holds. */
  readonly toolResultIds: readonly string[];
}

export interface EffectDoc {
  readonly key: string;
  readonly idempotencyKey: string;
  readonly unit: string | null;
  readonly state: string;
  readonly kind: string;
  readonly identity: string;
  readonly epoch: number;
  readonly commitUs: number;
  readonly lastOutcome: string | null;
  /** How a person or the reconciliation after a stop settled it (effects/after-stop.ts failedBecauseStopped reads it). */
  readonly resolution: string | null;
}

/** A fan-out unit's cost as its document records it (core/job.ts UnitRecord). */
export interface UnitCostDoc {
  readonly unit: string;
  readonly phase: string;
  readonly fanoutEpoch: number;
  readonly status: string;
  /** What the unit's claims spent (every claim's running tally, added up). */
  readonly cost: Readonly<Record<string, number>>;
  /** The part of `cost` already added to the job's cost. */
  readonly costInJob: Readonly<Record<string, number>>;
}

export interface ResultDoc {
  readonly path: string;
  readonly outcome: string | null;
  readonly missing: readonly string[];
  readonly commitUs: number;
}

export interface JobDoc {
  readonly status: string;
  readonly outcome: string | null;
  readonly pipeline: string;
  readonly idempotencyKey: string | null;
  readonly owner: string;
  readonly epoch: number;
  readonly staleReclaims: number;
  readonly attempts: number;
  readonly waiting: { readonly reason: string; readonly questionId: string; readonly question: string; readonly options: readonly string[]; readonly untilMs: number | null } | null;
  readonly lastError: { readonly code: string; readonly message: string } | null;
  readonly quarantine: { readonly reason: string } | null;
  /** `effectsSettled`: the record's own word on its effects (null when it gives none). */
  readonly cancellation: { readonly reason: string; readonly effectsSettled: boolean | null } | null;
  readonly cost: Readonly<Record<string, number>>;
  readonly decisions: Readonly<Record<string, string>>;
}

export interface CollectedJob {
  readonly id: string;
  readonly job: JobDoc;
  readonly events: readonly EventDoc[];
  readonly sections: readonly SectionDoc[];
  readonly checkpoints: readonly CheckpointDoc[];
  readonly transcripts: readonly TranscriptDoc[];
  readonly effects: readonly EffectDoc[];
  /** `jobs/{id}/results/final` and `conversations/{c}/messages/{id}`. */
  readonly results: readonly ResultDoc[];
  /** The job document as the engine decodes it (store/codec.ts), or null with the reason it does not decode. */
  readonly record: JobRecord | null;
  readonly recordProblem: string | null;
  /** Its fan-out unit documents (`units/{phase}~{unit}`) that decode, and why the others do not. */
  readonly units: readonly UnitView[];
  readonly unitProblems: readonly string[];
  /** The cost of each of those units. */
  readonly unitCosts: readonly UnitCostDoc[];
  /**
   * The job's documents that carry `expireAt` (a retention stamp), as `collection/id` under the
   * job, the job document itself as `.`: every collection read here and every expiring one.
   */
  readonly stamped: readonly string[];
}

/** A transcript version that held a tool call's result, as the soak's listener saw it. */
export interface ToolResultSeen {
  readonly jobId: string;
  readonly transcript: string;
  readonly callId: string;
  /** Commit time of that version. */
  readonly commitUs: number;
}

/** One line of the offline toolbox's execution log (functions/src/providers/offline/execution-log.ts). */
export interface ToolExecution {
  readonly callId: string;
  readonly tool: string;
  /** Wall-clock milliseconds when the execution began, in the worker process. */
  readonly startedAtMs: number;
  /** False for a simulated interrupted result: the call ran, its result never reached the section. */
  readonly delivered: boolean;
  readonly pid: number;
  /** The toolbox said the call has no external effect (absent: not said, counted as effectful). */
  readonly repeatable?: boolean | undefined;
  /** The claim it ran under: the step's unit (null: the job's own step) and that claim's epoch. */
  readonly claim?: { readonly unit: string | null; readonly epoch: number } | undefined;
}

export interface Submission {
  readonly index: number;
  readonly pipeline: string;
  readonly idempotencyKey: string;
  /** Every task ID a 202 answer carried, in order (a retried submit must give the same one). */
  readonly taskIds: readonly string[];
  /** Why the client never got a 202, when it did not. */
  readonly failure: string | null;
}

export interface ReceiverApplication {
  readonly key: string;
  readonly kind: string;
  readonly identity: string | null;
}

export interface ReceiverRequest {
  readonly op: 'apply' | 'lookup';
  readonly key: string;
  readonly outcome: number | string;
}

export interface ReceiverView {
  readonly applications: readonly ReceiverApplication[];
  readonly requests: readonly ReceiverRequest[];
}

export interface Observed {
  readonly jobs: readonly CollectedJob[];
  readonly submissions: readonly Submission[];
  readonly receiver: ReceiverView;
  /** Tool results seen in transcript versions while the run went on (final versions come with the jobs). */
  readonly toolResultsSeen: readonly ToolResultSeen[];
  /** Every tool execution of every worker process, from the offline toolbox's log. */
  readonly toolExecutions: readonly ToolExecution[];
}
