/**
 * What the invariant checker reads: plain data collected from Firestore (with Firestore's own
 * commit times) and from the receiver, and what the client recorded about its submissions. No
 * Firebase types here, so the checker is tested with synthetic documents.
 *
 * Commit times are microseconds since 1970 as Firestore assigns them (`updateTime`, `createTime`):
 * one clock, the database's, in commit order. Times the engine writes into documents (`atMs`,
 * `recordedAtMs`) come from each worker's clock before its commit and are not used for ordering.
 */

export interface EventDoc {
  readonly id: string;
  readonly kind: string;
  /** The job's epoch when the event was written. */
  readonly epoch: number;
  readonly unit: string | null;
  readonly commitUs: number;
}

/** A document a claim holder wrote, carrying the writer's fencing epoch. */
export interface OwnedWrite {
  readonly collection: 'sections' | 'checkpoints' | 'transcripts' | 'effects' | 'events';
  readonly id: string;
  /** null: the job's own claim; otherwise the fan-out unit whose claim (and epoch sequence) it is. */
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
  readonly cancellation: { readonly reason: string } | null;
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
}
