/**
 * What the CLI shows of a job and its timeline, read either through the REST API (the user) or
 * the admin SDK (an operator). The job view is a subset of the engine's JobRecord, so both paths
 * format the same way.
 */
import { z } from 'zod';
import { JOB_STATUSES, WAIT_REASONS, type JobRecord } from '../../functions/src/core/job';
import { messagePath, resultPath } from '../../functions/src/store/paths';
import { CliError } from './errors';

export type JobView = Pick<
  JobRecord,
  | 'id'
  | 'owner'
  | 'pipeline'
  | 'status'
  | 'outcome'
  | 'phase'
  | 'progress'
  | 'cost'
  | 'waiting'
  | 'lastError'
  | 'quarantine'
  | 'cancellation'
  | 'fanout'
  | 'conversationId'
  | 'createdAtMs'
  | 'updatedAtMs'
  | 'finishedAtMs'
>;

export interface EventView {
  readonly id: string;
  readonly kind: string;
  readonly message: string;
  readonly unit: string | null;
  readonly atMs: number;
}

const millis = z.date().transform((date) => date.getTime());
const counts = z.record(z.string(), z.number()).catch({});

/** The job document as the REST API returns it (timestamps already Dates). Tolerant of fields it does not show. */
const jobData = z.looseObject({
  owner: z.string(),
  pipeline: z.string(),
  status: z.enum(JOB_STATUSES),
  outcome: z.enum(['complete', 'partial']).nullish().transform((value) => value ?? null),
  phase: z.string().nullish().transform((value) => value ?? null),
  progress: counts.optional().transform((value) => value ?? {}),
  cost: counts.optional().transform((value) => value ?? {}),
  waiting: z
    .object({
      reason: z.enum(WAIT_REASONS),
      questionId: z.string(),
      question: z.string(),
      options: z.array(z.string()),
      until: millis.nullish(),
    })
    .nullish()
    .transform((value) => (value ? { reason: value.reason, questionId: value.questionId, question: value.question, options: value.options, untilMs: value.until ?? null } : null)),
  lastError: z
    .object({ code: z.string(), message: z.string(), retryable: z.boolean().catch(false), at: millis })
    .nullish()
    .transform((value) => (value ? { code: value.code, message: value.message, retryable: value.retryable, atMs: value.at } : null)),
  quarantine: z
    .object({ reason: z.string(), at: millis })
    .nullish()
    .transform((value) => (value ? { reason: value.reason, atMs: value.at } : null)),
  cancellation: z
    .object({
      reason: z.string(),
      at: millis,
      by: z.string().nullish(),
      phase: z.string().nullish(),
      sectionsDone: z.number().nullish(),
      effects: z
        .object({
          counts: z.object({ planned: z.number(), applying: z.number(), applied: z.number(), unknown: z.number(), failed: z.number() }),
          settled: z.boolean(),
          checkedWith: z.string().nullish(),
          checkedAt: millis.nullish(),
        })
        .nullish(),
    })
    .nullish()
    .transform((value) =>
      value
        ? {
            reason: value.reason,
            atMs: value.at,
            by: value.by ?? null,
            phase: value.phase ?? null,
            sectionsDone: value.sectionsDone ?? null,
            effects: value.effects
              ? { counts: value.effects.counts, settled: value.effects.settled, checkedWith: value.effects.checkedWith ?? null, checkedAtMs: value.effects.checkedAt ?? null }
              : null,
          }
        : null,
    ),
  fanout: z
    .object({ phase: z.string(), epoch: z.number(), units: z.number(), done: z.number() })
    .nullish()
    .transform((value) => value ?? null),
  conversationId: z.string().nullish().transform((value) => value ?? null),
  createdAt: millis,
  updatedAt: millis,
  finishedAt: millis.nullish().transform((value) => value ?? null),
});

export function jobViewFromData(id: string, data: unknown): JobView {
  const parsed = jobData.safeParse(data);
  if (!parsed.success) throw new CliError(`Job ${id} has a document this CLI cannot read:\n${z.prettifyError(parsed.error)}`);
  const doc = parsed.data;
  return {
    id,
    owner: doc.owner,
    pipeline: doc.pipeline,
    status: doc.status,
    outcome: doc.outcome,
    phase: doc.phase,
    progress: doc.progress,
    cost: doc.cost,
    waiting: doc.waiting,
    lastError: doc.lastError,
    quarantine: doc.quarantine,
    cancellation: doc.cancellation,
    fanout: doc.fanout,
    conversationId: doc.conversationId,
    createdAtMs: doc.createdAt,
    updatedAtMs: doc.updatedAt,
    finishedAtMs: doc.finishedAt,
  };
}

export function jobViewFromRecord(job: JobRecord): JobView {
  const { id, owner, pipeline, status, outcome, phase, progress, cost, waiting, lastError, quarantine, cancellation, fanout, conversationId, createdAtMs, updatedAtMs, finishedAtMs } = job;
  return { id, owner, pipeline, status, outcome, phase, progress, cost, waiting, lastError, quarantine, cancellation, fanout, conversationId, createdAtMs, updatedAtMs, finishedAtMs };
}

const eventData = z.looseObject({
  kind: z.string(),
  message: z.string(),
  unit: z.string().nullish().transform((value) => value ?? null),
  atMs: z.number(),
});

/** An event the CLI cannot read is shown as such rather than ending the watch. */
export function eventViewFromData(id: string, data: unknown): EventView {
  const parsed = eventData.safeParse(data);
  if (!parsed.success) return { id, kind: 'unreadable', message: `event ${id} has an unexpected shape`, unit: null, atMs: 0 };
  return { id, kind: parsed.data.kind, message: parsed.data.message, unit: parsed.data.unit, atMs: parsed.data.atMs };
}

/** Where the published answer of a completed job is. */
export function resultPathOf(job: Pick<JobView, 'id' | 'conversationId'>): string {
  return job.conversationId === null ? resultPath(job.id) : messagePath(job.conversationId, job.id);
}
