/**
 * The operator console's one endpoint, `opsAction`: `POST { action, jobId, ... }` with an operator's
 * Firebase ID token. Every call proves both who is asking (the token: 401 without a valid one) and
 * that they are an operator (the `admin` custom claim set to `true`: 403 otherwise), before the body
 * is even read, so a non-operator learns nothing about what the endpoint accepts and changes nothing.
 *
 * Actions (each one the engine's own function; the operator's uid is recorded as `by`):
 *   - `release` `{ jobId }`: a quarantined job back to the queue with fresh budgets (releaseQuarantined);
 *   - `cancel` `{ jobId, reason? }`: stop a queued, running or waiting job of any owner (cancelJob,
 *     as its owner would, with the reason naming the operator);
 *   - `redrive` `{ jobId, fromPhase, reason }`: run a finished, failed or quarantined job again from a
 *     phase (redriveJob).
 * Answers 200 with `{ action, jobId, status, by, ... }`; refusals are JSON `{ error, message }`:
 * 400 bad body, 401 no or bad token, 403 not an operator, 404 no such job, 405 not POST, 409 the
 * action does not apply to the job as it stands, 413/415 as for the other endpoints.
 */
import { z } from 'zod';
import { PhaselineError } from '../core/errors';
import { documentId } from '../core/ids';
import { PHASE_NAME_PATTERN, type PipelineRegistry } from '../core/pipeline';
import { cancellationReport } from '../effects/stop-report';
import { OperatorActionRefusedError, redriveJob, releaseQuarantined } from '../engine/operator';
import { cancelJob, OwnerActionError } from '../engine/owner-actions';
import type { JobStore } from '../store/job-store';
import type { TaskQueuePort } from '../store/task-queue';
import { answering, checkContentType, openRequest, readJsonBody, reply, type HttpRequest, type HttpResponse } from './request';

/** The custom claim that makes a user an operator; only the value `true` counts. */
export const OPERATOR_CLAIM = 'admin';

/** Checks a Firebase ID token; `admin` is whether it carries the operator claim as `true`. */
export type VerifyOperatorToken = (token: string) => Promise<{ readonly uid: string; readonly admin: boolean }>;

export interface OpsLogger {
  info(message: string, fields?: Record<string, unknown>): void;
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
}

export interface OpsActionDeps {
  readonly store: JobStore;
  readonly queue: TaskQueuePort;
  /** The pipelines a re-drive names phases of (the deployed ones; only their phase lists are read). */
  readonly pipelines: PipelineRegistry;
  readonly verifyToken: VerifyOperatorToken;
  /** Defaults to the console; the trigger passes the Cloud Functions logger (the audit trail). */
  readonly logger?: OpsLogger;
}

export const OPS_BODY_LIMIT_BYTES = 8 * 1024;

const jobId = documentId('jobId');
const reason = z.string().trim().min(1, 'reason must not be empty').max(500);

export const opsActionBody = z.discriminatedUnion('action', [
  z.strictObject({ action: z.literal('release'), jobId }),
  z.strictObject({ action: z.literal('cancel'), jobId, reason: reason.default('no reason given') }),
  z.strictObject({
    action: z.literal('redrive'),
    jobId,
    fromPhase: z.string().regex(PHASE_NAME_PATTERN, 'fromPhase must be a phase name (lower-case letters, digits and "-")'),
    reason,
  }),
]);

export type OpsActionRequest = z.infer<typeof opsActionBody>;

const consoleLogger: OpsLogger = {
  info: (message, fields) => console.info(message, fields ?? {}),
  warn: (message, fields) => console.warn(message, fields ?? {}),
  error: (message, fields) => console.error(message, fields ?? {}),
};

/** Runs one action for operator `by`; throws the engine's refusals. */
async function perform(deps: OpsActionDeps, request: OpsActionRequest, by: string, log: OpsLogger): Promise<Record<string, unknown>> {
  const nowMs = deps.store.clock.now();
  // One read first, so a job that does not exist is a 404 whatever the action; each action then
  // decides again from the job as its own transaction reads it.
  const job = await deps.store.read(request.jobId);
  if (!job) throw new OwnerActionError(404, `No job ${request.jobId}`);
  switch (request.action) {
    case 'release': {
      const released = await releaseQuarantined(deps.store, deps.queue, request.jobId, nowMs, (message, detail) => log.warn(`opsAction: ${message}`, detail), by);
      return { status: released.job.status, taskId: released.taskId, enqueued: released.enqueued };
    }
    case 'cancel': {
      // The owner's cancel, on behalf of the job's owner: the same transaction, effects marked the same way, the operator named.
      const { job: cancelled, unknownEffects } = await cancelJob(deps.store, { jobId: job.id, owner: job.owner, reason: request.reason, by });
      return { status: cancelled.status, unknownEffects, report: cancelled.cancellation ? cancellationReport(cancelled.cancellation) : null };
    }
    case 'redrive': {
      const redriven = await redriveJob(deps.store, deps.queue, { jobId: request.jobId, fromPhase: request.fromPhase, by, reason: request.reason }, nowMs, { pipelines: deps.pipelines });
      return { status: redriven.job.status, taskId: redriven.taskId, enqueued: redriven.enqueued, resumesAt: redriven.resumesAt, setAside: redriven.setAside };
    }
  }
}

export function createOpsActionHandler(deps: OpsActionDeps): (request: HttpRequest, response: HttpResponse) => Promise<void> {
  const log = deps.logger ?? consoleLogger;

  const opening = {
    endpoint: 'opsAction',
    usePost: 'use POST',
    verifyToken: deps.verifyToken,
    tokenRejected: 'The ID token was rejected (expired, revoked, malformed or for another project): sign in again',
    logger: log,
  };

  async function handle(request: HttpRequest, response: HttpResponse): Promise<void> {
    const identity = await openRequest(request, response, opening);
    if (identity === null) return;
    if (!identity.uid) throw new Error('The token verifier returned no uid');
    if (!identity.admin) {
      log.warn('opsAction: refused a user without the operator claim', { uid: identity.uid });
      return reply(response, {
        status: 403,
        error: 'forbidden',
        message: `User ${identity.uid} is not an operator: operator actions need the "${OPERATOR_CLAIM}" custom claim set to true (phaseline admin grant <uid>), then a new ID token`,
      });
    }
    const contentType = checkContentType(request.get('content-type'));
    if (contentType) return reply(response, contentType);
    const body = readJsonBody(request, OPS_BODY_LIMIT_BYTES);
    if (!body.ok) return reply(response, body.rejection);
    const parsed = opsActionBody.safeParse(body.value);
    if (!parsed.success) return reply(response, { status: 400, error: 'invalid_request', message: z.prettifyError(parsed.error) });

    const action = parsed.data;
    const audit = { action: action.action, jobId: action.jobId, by: identity.uid, ...('reason' in action ? { reason: action.reason } : {}), ...(action.action === 'redrive' ? { fromPhase: action.fromPhase } : {}) };
    try {
      const outcome = await perform(deps, action, identity.uid, log);
      log.info('opsAction: done', { ...audit, status: outcome.status });
      response.status(200).json({ action: action.action, jobId: action.jobId, by: identity.uid, ...outcome });
    } catch (error) {
      const refusal = refusalOf(error);
      if (!refusal) throw error;
      log.info('opsAction: refused', { ...audit, status: refusal.status, message: refusal.message });
      reply(response, refusal);
    }
  }

  return answering('opsAction', log, 'The operator action failed because of an internal error; look at the job before trying again', handle);
}

/** The engine's refusals as answers: nothing was written when one of these is thrown. */
function refusalOf(error: unknown): { status: number; error: string; message: string } | null {
  if (error instanceof OwnerActionError) {
    return { status: error.status, error: error.status === 404 ? 'not_found' : error.status === 409 ? 'conflict' : 'invalid_request', message: error.message };
  }
  if (error instanceof OperatorActionRefusedError) return { status: 409, error: 'conflict', message: error.message };
  if (error instanceof PhaselineError && error.code === 'invalid_input') return { status: 400, error: 'invalid_request', message: error.message };
  return null;
}
