/**
 * Job and unit documents <-> core records. Every read is zod-parsed: a document that does not
 * have the shape the engine wrote is refused, never half-trusted.
 */
import { Timestamp, type DocumentData } from 'firebase-admin/firestore';
import { z } from 'zod';
import { CorruptCheckpointError, UnreadableJobError } from '../core/errors';
import { JOB_STATUSES, UNIT_STATUSES, WAIT_REASONS, type Cancellation, type FanOutState, type JobRecord, type Lease, type UnitRecord } from '../core/job';

const millis = z.instanceof(Timestamp).transform((value) => value.toMillis());
const counts = z.record(z.string(), z.number());

const leaseSchema = z.object({ epoch: z.number().int(), worker: z.string(), expiresAt: millis, renewedAt: millis.nullable().optional() });

function decodeLease(lease: z.infer<typeof leaseSchema> | null): Lease | null {
  if (!lease) return null;
  const base = { epoch: lease.epoch, worker: lease.worker, expiresAtMs: lease.expiresAt };
  return lease.renewedAt === null || lease.renewedAt === undefined ? base : { ...base, renewedAtMs: lease.renewedAt };
}
const claimTallySchema = z.object({ epoch: z.number().int(), cost: counts, notes: z.number().int().nonnegative() });

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

const jobDocumentSchema = z.object({
  owner: z.string(),
  pipeline: z.string(),
  input: z.unknown(),
  conversationId: z.string().nullable(),
  idempotencyKey: z.string().nullable(),
  status: z.enum(JOB_STATUSES),
  outcome: z.enum(['complete', 'partial']).nullable(),
  phase: z.string().nullable(),
  epoch: z.number().int().nonnegative(),
  lease: leaseSchema.nullable(),
  step: z.number().int().nonnegative(),
  dispatch: z.number().int().nonnegative(),
  attempts: z.number().int().nonnegative(),
  staleReclaims: z.number().int().nonnegative(),
  nextRunAt: millis,
  progress: counts,
  cost: counts,
  lastError: z.object({ code: z.string(), message: z.string(), retryable: z.boolean(), at: millis }).nullable(),
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
  claimTally: claimTallySchema.nullable().default(null),
  eventSeq: z.number().int().nonnegative(),
  createdAt: millis,
  updatedAt: millis,
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

const ts = (ms: number): Timestamp => Timestamp.fromMillis(ms);
const tsOrNull = (ms: number | null): Timestamp | null => (ms === null ? null : ts(ms));

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
    id,
    owner: doc.owner,
    pipeline: doc.pipeline,
    input: doc.input,
    conversationId: doc.conversationId,
    idempotencyKey: doc.idempotencyKey,
    status: doc.status,
    outcome: doc.outcome,
    phase: doc.phase,
    epoch: doc.epoch,
    lease: decodeLease(doc.lease),
    step: doc.step,
    dispatch: doc.dispatch,
    attempts: doc.attempts,
    staleReclaims: doc.staleReclaims,
    nextRunAtMs: doc.nextRunAt,
    progress: doc.progress,
    cost: doc.cost,
    lastError: doc.lastError && { code: doc.lastError.code, message: doc.lastError.message, retryable: doc.lastError.retryable, atMs: doc.lastError.at },
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
    claimTally: doc.claimTally,
    eventSeq: doc.eventSeq,
    createdAtMs: doc.createdAt,
    updatedAtMs: doc.updatedAt,
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

const encodeLease = (lease: Lease | null) =>
  lease && { epoch: lease.epoch, worker: lease.worker, expiresAt: ts(lease.expiresAtMs), renewedAt: lease.renewedAtMs === undefined ? null : ts(lease.renewedAtMs) };

export function encodeJob(job: JobRecord): DocumentData {
  return {
    owner: job.owner,
    pipeline: job.pipeline,
    input: job.input,
    conversationId: job.conversationId,
    idempotencyKey: job.idempotencyKey,
    status: job.status,
    outcome: job.outcome,
    phase: job.phase,
    epoch: job.epoch,
    lease: encodeLease(job.lease),
    step: job.step,
    dispatch: job.dispatch,
    attempts: job.attempts,
    staleReclaims: job.staleReclaims,
    nextRunAt: ts(job.nextRunAtMs),
    progress: job.progress,
    cost: job.cost,
    lastError: job.lastError && { code: job.lastError.code, message: job.lastError.message, retryable: job.lastError.retryable, at: ts(job.lastError.atMs) },
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
    claimTally: job.claimTally,
    eventSeq: job.eventSeq,
    createdAt: ts(job.createdAtMs),
    updatedAt: ts(job.updatedAtMs),
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

const unitDocumentSchema = z.object({
  jobId: z.string(),
  unit: z.string(),
  phase: z.string(),
  fanoutEpoch: z.number().int(),
  status: z.enum(UNIT_STATUSES),
  epoch: z.number().int().nonnegative(),
  lease: leaseSchema.nullable(),
  step: z.number().int().nonnegative(),
  dispatch: z.number().int().nonnegative(),
  attempts: z.number().int().nonnegative(),
  staleReclaims: z.number().int().nonnegative(),
  nextRunAt: millis,
  progress: counts,
  cost: counts,
  costInJob: counts.default({}),
  claimTally: claimTallySchema.nullable().default(null),
  result: z.unknown(),
  /** Absent on results from before versions existed: version 1. */
  resultVersion: z.number().int().positive().optional(),
  lastError: z.object({ code: z.string(), message: z.string(), at: millis }).nullable(),
  updatedAt: millis,
});

function decodeFanOut(stored: { phase: string; epoch: number; units: number; done: number; unitIds?: string[] | undefined }): FanOutState {
  const { unitIds, ...counts } = stored;
  return unitIds === undefined ? counts : { ...counts, unitIds };
}

export function decodeUnit(path: string, data: DocumentData | undefined): UnitRecord {
  const parsed = unitDocumentSchema.safeParse(data);
  if (!parsed.success) throw new CorruptCheckpointError(`Unit ${path} has a malformed document: ${z.prettifyError(parsed.error)}`);
  const doc = parsed.data;
  return {
    jobId: doc.jobId,
    unit: doc.unit,
    phase: doc.phase,
    fanoutEpoch: doc.fanoutEpoch,
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
    costInJob: doc.costInJob,
    claimTally: doc.claimTally,
    result: doc.result ?? null,
    ...(doc.resultVersion === undefined ? {} : { resultVersion: doc.resultVersion }),
    lastError: doc.lastError && { code: doc.lastError.code, message: doc.lastError.message, atMs: doc.lastError.at },
    updatedAtMs: doc.updatedAt,
  };
}

/**
 * The fields a unit's holder renews on a heartbeat or progress flush, and only those: the rest of
 * the document (its poison count, its result) may be written by its holder's other commits.
 */
export function encodeUnitFlush(unit: Pick<UnitRecord, 'lease' | 'progress' | 'cost' | 'claimTally' | 'updatedAtMs'>): DocumentData {
  return { lease: encodeLease(unit.lease), progress: unit.progress, cost: unit.cost, claimTally: unit.claimTally, updatedAt: ts(unit.updatedAtMs) };
}

export function encodeUnit(unit: UnitRecord): DocumentData {
  return {
    jobId: unit.jobId,
    unit: unit.unit,
    phase: unit.phase,
    fanoutEpoch: unit.fanoutEpoch,
    status: unit.status,
    epoch: unit.epoch,
    lease: encodeLease(unit.lease),
    step: unit.step,
    dispatch: unit.dispatch,
    attempts: unit.attempts,
    staleReclaims: unit.staleReclaims,
    nextRunAt: ts(unit.nextRunAtMs),
    progress: unit.progress,
    cost: unit.cost,
    costInJob: unit.costInJob,
    claimTally: unit.claimTally,
    result: unit.result ?? null,
    ...(unit.resultVersion === undefined ? {} : { resultVersion: unit.resultVersion }),
    lastError: unit.lastError && { code: unit.lastError.code, message: unit.lastError.message, at: ts(unit.lastError.atMs) },
    updatedAt: ts(unit.updatedAtMs),
  };
}
