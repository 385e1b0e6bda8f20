/**
 * Accepting a job: validate the request against the named pipeline, write the job, enqueue its
 * first step. Transport-free (the HTTP layer reads headers and bodies) and Firebase-free at run
 * time (the store and the queue are passed in).
 */
import { z } from 'zod';
import { describeError } from '../core/errors';
import { documentId } from '../core/ids';
import type { JobRecord } from '../core/job';
import { jobDispatch } from '../core/transitions';
import type { PipelineRegistry } from '../core/pipeline';
import type { QuotaRefusal } from '../core/quota';
import type { JobStore, NewJob } from '../store/job-store';
import type { JobAdmission, Submitter } from '../store/quota-documents';
import type { TaskQueuePort } from '../store/task-queue';

/** Printable ASCII, 1 to 200 characters. Never a document ID itself: the job ID is a hash of owner and key. */
export const IDEMPOTENCY_KEY_PATTERN = /^[\x20-\x7E]{1,200}$/;

/** What a caller asked for, validated: the input is the pipeline schema's output. */
export interface Submission {
  readonly pipeline: string;
  readonly input: unknown;
  readonly conversationId: string | null;
  /** The version of the named pipeline the input was validated against: the job records it. */
  readonly pipelineVersion: number;
}

export type Validated<T> = { readonly ok: true; readonly value: T } | { readonly ok: false; readonly message: string };

function knownPipelines(pipelines: PipelineRegistry): string {
  const names = [...pipelines.keys()].sort();
  return names.length === 0 ? 'none are registered' : names.map((name) => `"${name}"`).join(', ');
}

/**
 * Builds the body validator for a registry: first the envelope (a strict object), then `input`
 * against the named pipeline's own schema, reported with paths under `input`.
 */
export function submissionValidator(pipelines: PipelineRegistry): (body: unknown) => Validated<Submission> {
  const known = knownPipelines(pipelines);
  const envelope = z.strictObject(
    {
      pipeline: z
        .string({
          error: (issue) =>
            `${issue.input === undefined ? 'pipeline is required' : `pipeline must be a string, not ${describeJsonType(issue.input)}`}: the name of a pipeline (known pipelines: ${known})`,
        })
        .min(1, 'pipeline must not be empty'),
      input: z.unknown().refine((value) => value !== undefined, 'input is required: the pipeline\'s input object'),
      // It names the conversations/{conversationId} document the answer is published to.
      conversationId: documentId('conversationId').optional(),
    },
    {
      error: (issue) =>
        issue.code === 'invalid_type'
          ? `The body must be a JSON object like {"pipeline": "<name>", "input": {...}}; got ${describeJsonType(issue.input)}`
          : undefined,
    },
  );
  return (body) => {
    const parsed = envelope.safeParse(body);
    if (!parsed.success) return { ok: false, message: `Invalid request body:\n${z.prettifyError(parsed.error)}` };
    const { pipeline: name, input, conversationId } = parsed.data;
    const pipeline = pipelines.get(name);
    if (!pipeline) return { ok: false, message: `Unknown pipeline "${name}" (known pipelines: ${known})` };
    // Wrapped so that the issue paths read `input.field`, as the caller wrote the body.
    const checked = z.object({ input: pipeline.input }).safeParse({ input });
    if (!checked.success) return { ok: false, message: `Invalid input for pipeline "${name}":\n${z.prettifyError(checked.error)}` };
    return { ok: true, value: { pipeline: name, input: checked.data.input, conversationId: conversationId ?? null, pipelineVersion: pipeline.version ?? 1 } };
  };
}

export function describeJsonType(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (value === undefined) return 'nothing';
  return typeof value === 'object' ? 'an object' : `a ${typeof value}`;
}

/** The Idempotency-Key header: absent is fine (no key), present must fit the pattern. */
export function parseIdempotencyKey(header: string | undefined): Validated<string | null> {
  if (header === undefined) return { ok: true, value: null };
  if (IDEMPOTENCY_KEY_PATTERN.test(header)) return { ok: true, value: header };
  const problem =
    header.length === 0 ? 'it is empty' : header.length > 200 ? `it is ${header.length} characters long` : 'it contains characters outside printable ASCII';
  return { ok: false, message: `Idempotency-Key must be 1 to 200 printable ASCII characters; ${problem}` };
}

export interface SubmitLogger {
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
}

/** The limits per user (store/quota-documents' SubmitQuota): an admission check for each submitter. */
export interface SubmitQuotaPort {
  admission(submitter: Submitter): JobAdmission;
}

export interface SubmitDeps {
  readonly store: Pick<JobStore, 'createJob'>;
  readonly queue: TaskQueuePort;
  readonly logger: SubmitLogger;
  /** Absent where no user submits (tools that create jobs for themselves): no limit applies. */
  readonly quota?: SubmitQuotaPort;
}

export type SubmitOutcome =
  /** `created` is false for a repeat of an earlier request with the same owner and key. */
  | { readonly kind: 'accepted'; readonly job: JobRecord; readonly created: boolean }
  /** The owner reused an Idempotency-Key for a different request; nothing was written. */
  | { readonly kind: 'conflict'; readonly job: JobRecord }
  /** A new job would pass one of the owner's limits; nothing was written. */
  | { readonly kind: 'over_limit'; readonly refusal: QuotaRefusal };

/**
 * Writes the job and enqueues its first step, unless the owner's limits refuse a new job (`caller`
 * says which defaults apply: an anonymous account's are lower). A repeat enqueues nothing and is
 * never refused. An enqueue that fails
 * after the job was written is logged, not raised: the job is durable and queued, and the sweeper
 * re-dispatches queued jobs whose task went missing.
 */
export async function submitJob(deps: SubmitDeps, request: NewJob, caller: Pick<Submitter, 'anonymous'> = { anonymous: false }): Promise<SubmitOutcome> {
  const result = await deps.store.createJob(request, deps.quota?.admission({ uid: request.owner, anonymous: caller.anonymous }));
  if ('refused' in result) return { kind: 'over_limit', refusal: result.refused };
  if ('conflict' in result) return { kind: 'conflict', job: result.job };
  const { job, created } = result;
  if (created) {
    const { task, id } = jobDispatch(job);
    try {
      await deps.queue.enqueue(task, { id });
    } catch (error) {
      deps.logger.warn('submitJob: the job is written but its first task could not be enqueued; the sweeper will dispatch it', {
        jobId: job.id,
        taskId: id,
        error: describeError(error),
      });
    }
  }
  return { kind: 'accepted', job, created };
}
