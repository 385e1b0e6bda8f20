/**
 * Job and unit documents <-> core records. Every read is zod-parsed: a document that does not
 * have the shape the engine wrote is refused, never half-trusted.
 */
import { Timestamp, type DocumentData } from 'firebase-admin/firestore';
import { z } from 'zod';
import { CorruptCheckpointError, UnreadableJobError } from '../core/errors';
import { JOB_STATUSES, UNIT_STATUSES, WAIT_REASONS, type Cancellation, type FanOutState, type JobRecord, type Lease, type LeaseHolder, type RecordedError, type UnitRecord } from '../core/job';

const millis = z.instanceof(Timestamp).transform((value) => value.toMillis());
const counts = z.record(z.string(), z.number());

const leaseSchema = z.object({ epoch: z.number().int(), worker: z.string(), expiresAt: millis, renewedAt: millis.nullable().optional() });

function decodeLease(lease: z.infer<typeof leaseSchema> | null): Lease | null {
  if (!lease) return null;
  const base = { epoch: lease.epoch, worker: lease.worker, expiresAtMs: lease.expiresAt };
  return lease.renewedAt === null || lease.renewedAt === undefined ? base : { ...base, renewedAtMs: lease.renewedAt };
}
const claimTallySchema = z.object({ epoch: z.number().int(), cost: counts, notes: z.number().int().nonnegative() });

const ts = (ms: number): Timestamp => Timestamp.fromMillis(ms);
const tsOrNull = (ms: number | null): Timestamp | null => (ms === null ? null : ts(ms));

const encodeLease = (lease: Lease | null) =>
  lease && { epoch: lease.epoch, worker: lease.worker, expiresAt: ts(lease.expiresAtMs), renewedAt: lease.renewedAtMs === undefined ? null : ts(lease.renewedAtMs) };

/**
 * The claim fields a job document and a unit document share (core's `LeaseHolder`), declared once:
 * each record names its statuses and what its last error carries beyond code, message and time.
 */
const claimFields = z.object({
  epoch: z.number().int().nonnegative(),
  lease: leaseSchema.nullable(),
  step: z.number().int().nonnegative(),
  dispatch: z.number().int().nonnegative(),
  attempts: z.number().int().nonnegative(),
  staleReclaims: z.number().int().nonnegative(),
  nextRunAt: millis,
  progress: counts,
  cost: counts,
  claimTally: claimTallySchema.nullable().default(null),
  updatedAt: millis,
});

function claimSchema<const TStatuses extends readonly [string, ...string[]], TErrorExtra extends z.ZodRawShape>(statuses: TStatuses, errorExtra: TErrorExtra) {
  return claimFields.extend({
    status: z.enum(statuses),
    lastError: z.object({ code: z.string(), message: z.string(), at: millis, ...errorExtra }).nullable(),
  });
}

interface StoredError {
  readonly code: string;
  readonly message: string;
  readonly at: number;
}

type StoredClaim<TStatus extends string, TError extends StoredError> = z.output<typeof claimFields> & { readonly status: TStatus; readonly lastError: TError | null };

function decodeClaim<TStatus extends string, TError extends StoredError>(doc: StoredClaim<TStatus, TError>): LeaseHolder<TStatus, RecordedError & Omit<TError, 'at'>> {
  let lastError: (RecordedError & Omit<TError, 'at'>) | null = null;
  if (doc.lastError !== null) {
    const { at, ...rest } = doc.lastError;
    lastError = { ...rest, code: doc.lastError.code, message: doc.lastError.message, atMs: at };
  }
  return {
    status: doc.status,
    epoch: doc.epoch,
    lease: decodeLease(doc.lease),
    step: doc.step,
    dispatch: doc.dispatch,
    attempts: doc.attempts,
    staleReclaims: doc.staleReclaims,
    nextRunAtMs: doc.nextRunAt,
    progress: doc.progress,
    cost: doc.cost,
    lastError,
    claimTally: doc.claimTally,
    updatedAtMs: doc.updatedAt,
  };
}

/** The shared claim fields as stored; `errorExtra` gives what the holder's last error carries beyond code, message and time. */
function encodeClaim<TError extends RecordedError>(holder: LeaseHolder<string, TError>, errorExtra: (error: TError) => DocumentData): DocumentData {
  const error = holder.lastError;
  return {
    status: holder.status,
    epoch: holder.epoch,
    lease: encodeLease(holder.lease),
    step: holder.step,
    dispatch: holder.dispatch,
    attempts: holder.attempts,
    staleReclaims: holder.staleReclaims,
    nextRunAt: ts(holder.nextRunAtMs),
    progress: holder.progress,
    cost: holder.cost,
    lastError: error && { code: error.code, message: error.message, ...errorExtra(error), at: ts(error.atMs) },
    claimTally: holder.claimTally,
    updatedAt: ts(holder.updatedAtMs),
  };
}

const effectCountsSchema = z.object({
  planned: z.number().int().nonnegative(),
  applying: z.number().int().nonnegative(),
  applied: z.number().int().nonnegative(),
  unknown: z.number().int().nonnegative(),
  failed: z.number().int().nonnegative(),
});

/**
 * Structured fields only: the words are rendered where they are shown. A cancellation written
 * before these fields existed (it had a `report` sentence) reads with them empty.
 */
const cancellationSchema = z.object({
  at: millis,
  reason: z.string(),
  by: z.string().nullable().default(null),
  phase: z.string().nullable().default(null),
  sectionsDone: z.number().int().nonnegative().nullable().default(null),
  effects: z
    .object({ counts: effectCountsSchema, settled: z.boolean(), checkedWith: z.string().nullable(), checkedAt: millis.nullable() })
    .nullable()
    .default(null),
});

const jobDocumentSchema = claimSchema(JOB_STATUSES, { retryable: z.boolean() }).extend({
  owner: z.string(),
  pipeline: z.string(),
  input: z.unknown(),
  conversationId: z.string().nullable(),
  idempotencyKey: z.string().nullable(),
  outcome: z.enum(['complete', 'partial']).nullable(),
  phase: z.string().nullable(),
  waiting: z
    .object({
      reason: z.enum(WAIT_REASONS),
      questionId: z.string(),
      question: z.string(),
      options: z.array(z.string()),
      until: millis.nullable(),
    })
    .nullable(),
  quarantine: z.object({ reason: z.string(), at: millis }).nullable(),
  decisions: z.record(z.string(), z.string()),
  cancellation: cancellationSchema.nullable(),
  effectsToSettleAt: millis.nullable().default(null),
  /** Absent on jobs written before retention existed: read as nothing to stamp (they keep their documents). */
  retention: z.object({ dueAt: millis, cursor: z.string().nullable() }).nullable().default(null),
  fanout: z
    .object({ phase: z.string(), epoch: z.number().int(), units: z.number().int(), done: z.number().int(), unitIds: z.array(z.string()).optional() })
    .nullable(),
  eventSeq: z.number().int().nonnegative(),
  createdAt: millis,
  finishedAt: millis.nullable(),
  /** Absent on jobs written before versions existed: version 1 (every pipeline was at 1 then). Null: not recorded by its creator. */
  pipelineVersion: z.number().int().positive().nullable().default(1),
  /** Absent on jobs never re-driven. */
  redrive: z
    .object({
      count: z.number().int().positive(),
      fromPhase: z.string(),
      by: z.string(),
      reason: z.string(),
      at: millis,
      previousStatus: z.enum(JOB_STATUSES),
      setAside: z.number().int().nonnegative(),
      auditPrefix: z.string(),
    })
    .nullable()
    .default(null),
});

function decodeCancellation(doc: z.infer<typeof cancellationSchema>): Cancellation {
  const effects = doc.effects && { counts: doc.effects.counts, settled: doc.effects.settled, checkedWith: doc.effects.checkedWith, checkedAtMs: doc.effects.checkedAt };
  return { atMs: doc.at, reason: doc.reason, by: doc.by, phase: doc.phase, sectionsDone: doc.sectionsDone, effects };
}

function encodeCancellation(cancellation: Cancellation): DocumentData {
  const { effects } = cancellation;
  return {
    at: ts(cancellation.atMs),
    reason: cancellation.reason,
    by: cancellation.by,
    phase: cancellation.phase,
    sectionsDone: cancellation.sectionsDone,
    effects: effects && { counts: effects.counts, settled: effects.settled, checkedWith: effects.checkedWith, checkedAt: tsOrNull(effects.checkedAtMs) },
  };
}

export function decodeJob(id: string, data: DocumentData | undefined): JobRecord {
  const parsed = jobDocumentSchema.safeParse(data);
  if (!parsed.success) throw new UnreadableJobError(id, `Job ${id} has a malformed document: ${z.prettifyError(parsed.error)}`);
  const doc = parsed.data;
  return {
    ...decodeClaim(doc),
    id,
    owner: doc.owner,
    pipeline: doc.pipeline,
    input: doc.input,
    conversationId: doc.conversationId,
    idempotencyKey: doc.idempotencyKey,
    outcome: doc.outcome,
    phase: doc.phase,
    waiting: doc.waiting && {
      reason: doc.waiting.reason,
      questionId: doc.waiting.questionId,
      question: doc.waiting.question,
      options: doc.waiting.options,
      untilMs: doc.waiting.until,
    },
    quarantine: doc.quarantine && { reason: doc.quarantine.reason, atMs: doc.quarantine.at },
    decisions: doc.decisions,
    cancellation: doc.cancellation && decodeCancellation(doc.cancellation),
    effectsToSettleAtMs: doc.effectsToSettleAt,
    retention: doc.retention && { dueAtMs: doc.retention.dueAt, cursor: doc.retention.cursor },
    fanout: doc.fanout === null ? null : decodeFanOut(doc.fanout),
    eventSeq: doc.eventSeq,
    createdAtMs: doc.createdAt,
    finishedAtMs: doc.finishedAt,
    pipelineVersion: doc.pipelineVersion,
    redrive: doc.redrive && {
      count: doc.redrive.count,
      fromPhase: doc.redrive.fromPhase,
      by: doc.redrive.by,
      reason: doc.redrive.reason,
      atMs: doc.redrive.at,
      previousStatus: doc.redrive.previousStatus,
      setAside: doc.redrive.setAside,
      auditPrefix: doc.redrive.auditPrefix,
    },
  };
}

export function encodeJob(job: JobRecord): DocumentData {
  return {
    ...encodeClaim(job, (error) => ({ retryable: error.retryable })),
    owner: job.owner,
    pipeline: job.pipeline,
    input: job.input,
    conversationId: job.conversationId,
    idempotencyKey: job.idempotencyKey,
    outcome: job.outcome,
    phase: job.phase,
    waiting: job.waiting && {
      reason: job.waiting.reason,
      questionId: job.waiting.questionId,
      question: job.waiting.question,
      options: job.waiting.options,
      until: tsOrNull(job.waiting.untilMs),
    },
    quarantine: job.quarantine && { reason: job.quarantine.reason, at: ts(job.quarantine.atMs) },
    decisions: job.decisions,
    cancellation: job.cancellation && encodeCancellation(job.cancellation),
    effectsToSettleAt: tsOrNull(job.effectsToSettleAtMs ?? null),
    retention: job.retention ? { dueAt: ts(job.retention.dueAtMs), cursor: job.retention.cursor } : null,
    fanout: job.fanout,
    eventSeq: job.eventSeq,
    createdAt: ts(job.createdAtMs),
    finishedAt: tsOrNull(job.finishedAtMs),
    pipelineVersion: job.pipelineVersion ?? null,
    redrive: job.redrive
      ? {
          count: job.redrive.count,
          fromPhase: job.redrive.fromPhase,
          by: job.redrive.by,
          reason: job.redrive.reason,
          at: ts(job.redrive.atMs),
          previousStatus: job.redrive.previousStatus,
          setAside: job.redrive.setAside,
          auditPrefix: job.redrive.auditPrefix,
        }
      : null,
  };
}

export { UNIT_STATUSES, type UnitRecord, type UnitStatus } from '../core/job';

const unitDocumentSchema = claimSchema(UNIT_STATUSES, {}).extend({
  jobId: z.string(),
  unit: z.string(),
  phase: z.string(),
  fanoutEpoch: z.number().int(),
  costInJob: counts.default({}),
  result: z.unknown(),
  /** Absent on results from before versions existed: version 1. */
  resultVersion: z.number().int().positive().optional(),
});

function decodeFanOut(stored: { phase: string; epoch: number; units: number; done: number; unitIds?: string[] | undefined }): FanOutState {
  const { unitIds, ...counts } = stored;
  return unitIds === undefined ? counts : { ...counts, unitIds };
}

/** A unit's fields beyond its claim: stored as they are held, so one picking serves both directions. */
function unitOwnFields(from: Pick<UnitRecord, 'jobId' | 'unit' | 'phase' | 'fanoutEpoch' | 'costInJob' | 'result'> & { readonly resultVersion?: number | undefined }) {
  return {
    jobId: from.jobId,
    unit: from.unit,
    phase: from.phase,
    fanoutEpoch: from.fanoutEpoch,
    costInJob: from.costInJob,
    result: from.result ?? null,
    ...(from.resultVersion === undefined ? {} : { resultVersion: from.resultVersion }),
  };
}

export function decodeUnit(path: string, data: DocumentData | undefined): UnitRecord {
  const parsed = unitDocumentSchema.safeParse(data);
  if (!parsed.success) throw new CorruptCheckpointError(`Unit ${path} has a malformed document: ${z.prettifyError(parsed.error)}`);
  const doc = parsed.data;
  return { ...decodeClaim(doc), ...unitOwnFields(doc) };
}

/**
 * The fields a unit's holder renews on a heartbeat or progress flush, and only those: the rest of
 * the document (its poison count, its result) may be written by its holder's other commits.
 */
export function encodeUnitFlush(unit: Pick<UnitRecord, 'lease' | 'progress' | 'cost' | 'claimTally' | 'updatedAtMs'>): DocumentData {
  return { lease: encodeLease(unit.lease), progress: unit.progress, cost: unit.cost, claimTally: unit.claimTally, updatedAt: ts(unit.updatedAtMs) };
}

export function encodeUnit(unit: UnitRecord): DocumentData {
  return { ...encodeClaim(unit, () => ({})), ...unitOwnFields(unit) };
}
