/**
 * The HTTP side of `submitJob`: the shared opening (http/request.ts: method, CORS, the caller's ID
 * token, content type, size and JSON), then the engine's validation and write. Every refusal is a
 * JSON `{ error, message }` with a status that names the problem; only a fault of ours is a 500.
 *
 * A repeat of an earlier submission (same owner, same Idempotency-Key) gets the same 202 body
 * with an `Idempotent-Replayed: true` header. A new job past one of the owner's limits gets a 429
 * with `Retry-After`, a sentence naming the limit and the limit's code in `limit`. A pipeline the
 * caller may not run (its access policy, core/pipeline.ts) is a 403, before its input is looked at.
 */
import { describeError, PhaselineError } from '../core/errors';
import { grantedPipelinesOf, pipelineAccessRefusal, type PipelineCaller, type PipelineDefinition, type PipelineRegistry } from '../core/pipeline';
import type { QuotaRefusal } from '../core/quota';
import { parseIdempotencyKey, submissionValidator, submitJob, type SubmitDeps, type SubmitLogger, type SubmitQuotaPort } from '../engine/submit';
import { jobPath } from '../store/paths';
import { answering, checkContentType, openRequest, readJsonBody, reply, type HttpRequest, type HttpResponse, type Rejection } from './request';

/**
 * Checks a Firebase ID token and names its user; rejects when the token is not valid (the triggers
 * pass http/caller-identity.ts's verifier, which refuses disabled and revoked accounts too).
 * `signInProvider` is the token's `firebase.sign_in_provider` ("anonymous" for anonymous accounts);
 * `claims` its claims, custom ones included.
 */
export type VerifyToken = (token: string) => Promise<{ readonly uid: string; readonly signInProvider?: string; readonly claims?: Readonly<Record<string, unknown>> }>;

/** The sign-in provider Firebase names anonymous accounts with; they get their own, lower limits. */
export const ANONYMOUS_SIGN_IN_PROVIDER = 'anonymous';

/** What the pipelines' access policies look at, from a verified token. */
export function callerOf(identity: Awaited<ReturnType<VerifyToken>>): PipelineCaller {
  return { uid: identity.uid, anonymous: identity.signInProvider === ANONYMOUS_SIGN_IN_PROVIDER, grantedPipelines: grantedPipelinesOf(identity.claims) };
}

/** 403: the caller is known, and may not do this. */
export function forbidden(message: string): Rejection {
  return { status: 403, error: 'forbidden', message };
}

/** The registered pipeline a body names, if it names one (the validator says what is wrong otherwise). */
function namedPipeline(pipelines: PipelineRegistry, body: unknown): PipelineDefinition<unknown> | undefined {
  const name = typeof body === 'object' && body !== null ? (body as { readonly pipeline?: unknown }).pipeline : undefined;
  return typeof name === 'string' ? pipelines.get(name) : undefined;
}

export interface SubmitHandlerDeps {
  readonly store: SubmitDeps['store'];
  readonly queue: SubmitDeps['queue'];
  readonly verifyToken: VerifyToken;
  readonly pipelines: PipelineRegistry;
  /** Defaults to the console; the trigger passes the Cloud Functions logger. */
  readonly logger?: SubmitLogger;
  /** The limits per user; the trigger always passes them. Without, no limit applies. */
  readonly quota?: SubmitQuotaPort;
}

/** The body the endpoint answers a submission with, new or repeated. */
export interface SubmitAnswer {
  readonly taskId: string;
  readonly status: string;
  readonly statusPath: string;
}

const consoleLogger: SubmitLogger = {
  warn: (message, fields) => console.warn(message, fields ?? {}),
  error: (message, fields) => console.error(message, fields ?? {}),
};

/** 429: which limit (`limit`), how many are allowed, and when to try again (`Retry-After`, in seconds). */
export function overLimit(refusal: QuotaRefusal): Rejection {
  return {
    status: 429,
    error: 'quota_exceeded',
    message: refusal.message,
    headers: { 'Retry-After': String(refusal.retryAfterSeconds) },
    fields: { limit: refusal.limit, allowed: refusal.allowed, retryAfterSeconds: refusal.retryAfterSeconds },
  };
}

/** How long a submit that lost its commit races is told to wait: long enough for a burst of submits to drain. */
export const CONTENDED_RETRY_AFTER_SECONDS = 2;

/** 503: nothing was decided for this request; the same request (same Idempotency-Key) may be sent again after `Retry-After`. */
function contended(): Rejection {
  return {
    status: 503,
    error: 'contended',
    message: `The job could not be written just now: other submissions kept changing the records it is counted against (or the database did not answer). Try again in ${CONTENDED_RETRY_AFTER_SECONDS} seconds; resending with the same Idempotency-Key is safe.`,
    headers: { 'Retry-After': String(CONTENDED_RETRY_AFTER_SECONDS) },
    fields: { retryAfterSeconds: CONTENDED_RETRY_AFTER_SECONDS },
  };
}

export function createSubmitHandler(deps: SubmitHandlerDeps): (request: HttpRequest, response: HttpResponse) => Promise<void> {
  const validate = submissionValidator(deps.pipelines);
  const logger = deps.logger ?? consoleLogger;
  const engine: SubmitDeps = { store: deps.store, queue: deps.queue, logger, ...(deps.quota ? { quota: deps.quota } : {}) };

  const opening = {
    endpoint: 'submitJob',
    usePost: 'submit a job with POST',
    verifyToken: (token: string) => deps.verifyToken(token).then(callerOf),
    tokenRejected: 'The ID token was rejected (expired, revoked, malformed or for another project): sign in again',
    logger,
  };

  async function handle(request: HttpRequest, response: HttpResponse): Promise<void> {
    const caller = await openRequest(request, response, opening);
    if (caller === null) return;
    const { uid: owner, anonymous } = caller;
    if (!owner) throw new Error('The token verifier returned no uid');

    const contentType = checkContentType(request.get('content-type'));
    if (contentType) return reply(response, contentType);
    const key = parseIdempotencyKey(request.get('idempotency-key'));
    if (!key.ok) return reply(response, { status: 400, error: 'invalid_idempotency_key', message: key.message });
    const body = readJsonBody(request);
    if (!body.ok) return reply(response, body.rejection);
    // Whether the caller may run the named pipeline at all comes before what its input should be.
    const named = namedPipeline(deps.pipelines, body.value);
    const refusal = named ? pipelineAccessRefusal(named, caller) : null;
    if (refusal !== null) return reply(response, forbidden(refusal));
    const submission = validate(body.value);
    if (!submission.ok) return reply(response, { status: 400, error: 'invalid_request', message: submission.message });

    let outcome;
    try {
      outcome = await submitJob(engine, { owner, ...submission.value, idempotencyKey: key.value }, { anonymous });
    } catch (error) {
      // The store refuses some requests only it can judge (a conversation owned by someone else).
      if (error instanceof PhaselineError && error.code === 'invalid_input') {
        return reply(response, { status: 400, error: 'invalid_request', message: error.message });
      }
      // Not a fault to report as one: the commit lost every race for the documents it is counted against (or Firestore kept failing), and a retry later is the remedy.
      if (error instanceof PhaselineError && error.code === 'checkpoint_write_failed') {
        logger.warn('submitJob: the job could not be written now; the caller is told to retry', { error: describeError(error) });
        return reply(response, contended());
      }
      throw error;
    }
    if (outcome.kind === 'over_limit') return reply(response, overLimit(outcome.refusal));
    if (outcome.kind === 'conflict') {
      return reply(response, {
        status: 422,
        error: 'idempotency_key_reused',
        message: `This Idempotency-Key was already used for a different request (job ${outcome.job.id}): resend that exact request, or use a new key for a new one`,
      });
    }
    const { job } = outcome;
    if (!outcome.created) response.set('Idempotent-Replayed', 'true');
    const answer: SubmitAnswer = { taskId: job.id, status: job.status, statusPath: jobPath(job.id) };
    response.status(202).json(answer);
  }

  return answering('submitJob', logger, 'The job could not be submitted because of an internal error; retrying with the same Idempotency-Key is safe', handle);
}
