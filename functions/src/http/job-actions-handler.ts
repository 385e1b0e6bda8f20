/**
 * The owner's actions on a job over HTTP: `cancelJob` (`{ jobId, reason? }`) and `decideJob`
 * (`{ jobId, questionId, answer }`). Same checks and error shape as submitJob; answers 200 with
 * `{ jobId, status }`. An answer is refused (403) to an owner who may no longer run the job's
 * pipeline (its access policy, core/pipeline.ts): it would make the job go on.
 */
import { z } from 'zod';
import { documentId } from '../core/ids';
import type { JobRecord } from '../core/job';
import { pipelineAccessRefusal, type PipelineCaller, type PipelineRegistry } from '../core/pipeline';
import { cancellationReport } from '../effects/stop-report';
import { cancelJob, decideJob, OwnerActionError } from '../engine/owner-actions';
import type { JobStore } from '../store/job-store';
import type { TaskQueuePort } from '../store/task-queue';
import { answering, checkContentType, openRequest, readJsonBody, reply, type HttpRequest, type HttpResponse } from './request';
import { callerOf, type VerifyToken } from './submit-handler';

// Checked before any read: an ID Firestore refuses would otherwise surface as a 500.
const jobId = documentId('jobId');
const cancelBody = z.strictObject({ jobId, reason: z.string().trim().min(1).max(500).default('no reason given') });
const decideBody = z.strictObject({ jobId, questionId: z.string().min(1).max(128), answer: z.string().min(1).max(500) });

export interface JobActionDeps {
  readonly store: JobStore;
  readonly queue: TaskQueuePort;
  readonly verifyToken: VerifyToken;
  /** Their access policies decide who may answer a job's question (an answer makes it go on); cancelling is always the owner's. */
  readonly pipelines: PipelineRegistry;
  readonly logger?: { warn(message: string, fields?: Record<string, unknown>): void; error(message: string, fields?: Record<string, unknown>): void };
}

type Action = 'cancel' | 'decide';

export function createJobActionHandler(action: Action, deps: JobActionDeps): (request: HttpRequest, response: HttpResponse) => Promise<void> {
  const logger = deps.logger ?? { warn: console.warn, error: console.error };

  const opening = {
    endpoint: `${action}Job`,
    usePost: 'use POST',
    verifyToken: (token: string): Promise<PipelineCaller> => deps.verifyToken(token).then(callerOf),
    tokenRejected: 'The ID token was rejected: sign in again',
    logger,
  };

  async function handle(request: HttpRequest, response: HttpResponse): Promise<void> {
    const caller = await openRequest(request, response, opening);
    if (caller === null) return;
    const owner = caller.uid;
    const contentType = checkContentType(request.get('content-type'));
    if (contentType) return reply(response, contentType);
    const body = readJsonBody(request, 8 * 1024);
    if (!body.ok) return reply(response, body.rejection);
    try {
      if (action === 'cancel') {
        const parsed = cancelBody.safeParse(body.value);
        if (!parsed.success) return reply(response, { status: 400, error: 'invalid_request', message: z.prettifyError(parsed.error) });
        const { job, unknownEffects } = await cancelJob(deps.store, { ...parsed.data, owner });
        response.status(200).json({ jobId: job.id, status: job.status, unknownEffects, report: job.cancellation ? cancellationReport(job.cancellation) : null });
        return;
      }
      const parsed = decideBody.safeParse(body.value);
      if (!parsed.success) return reply(response, { status: 400, error: 'invalid_request', message: z.prettifyError(parsed.error) });
      const mayGoOn = (job: JobRecord) => pipelineAccessRefusal(deps.pipelines.get(job.pipeline) ?? { name: job.pipeline }, caller);
      const job = await decideJob(deps.store, deps.queue, { ...parsed.data, owner }, mayGoOn);
      response.status(200).json({ jobId: job.id, status: job.status });
    } catch (error) {
      if (error instanceof OwnerActionError) {
        const code = error.status === 404 ? 'not_found' : error.status === 409 ? 'conflict' : error.status === 403 ? 'forbidden' : 'invalid_request';
        return reply(response, { status: error.status, error: code, message: error.message });
      }
      throw error;
    }
  }

  return answering(`${action}Job`, logger, `The ${action} request failed because of an internal error; it is safe to retry`, handle);
}
