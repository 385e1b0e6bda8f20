/**
 * The HTTP side of `submitJob`: method, CORS, the caller's ID token, content type, size and JSON,
 * then the engine's validation and write. Every refusal is a JSON `{ error, message }` with a
 * status that names the problem; only a fault of ours is a 500.
 *
 * A repeat of an earlier submission (same owner, same Idempotency-Key) gets the same 202 body
 * with an `Idempotent-Replayed: true` header. A new job past one of the owner's limits gets a 429
 * with `Retry-After`, a sentence naming the limit and the limit's code in `limit`. A pipeline the
 * caller may not run (its access policy, core/pipeline.ts) is a 403, before its input is looked at.
 *
 * The request and response types are the few members used, so the express objects from
 * firebase-functions fit them and tests can pass plain objects.
 */
import { describeError, PhaselineError } from '../core/errors';
import { grantedPipelinesOf, pipelineAccessRefusal, type PipelineCaller, type PipelineDefinition, type PipelineRegistry } from '../core/pipeline';
import type { QuotaRefusal } from '../core/quota';
import { parseIdempotencyKey, submissionValidator, submitJob, type SubmitDeps, type SubmitLogger, type SubmitQuotaPort } from '../engine/submit';
import { jobPath } from '../store/paths';
import { answerPreflight, applyCorsHeaders, CORS_ALLOWED_METHODS } from './cors';

/** Largest accepted body, measured on the raw bytes when the framework kept them. */
export const SUBMIT_BODY_LIMIT_BYTES = 64 * 1024;

export interface HttpRequest {
  readonly method: string;
  get(name: string): string | undefined;
  /** What the framework parsed, if anything; used only when `rawBody` is missing. */
  readonly body?: unknown;
  readonly rawBody?: Buffer | undefined;
}

export interface HttpResponse {
  status(code: number): HttpResponse;
  set(field: string, value: string): HttpResponse;
  json(body: unknown): unknown;
  end(): unknown;
}

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

export interface Rejection {
  readonly status: number;
  /** A stable code for programs. */
  readonly error: string;
  /** A sentence for people: names the field or header at fault and what is expected. */
  readonly message: string;
  readonly headers?: Readonly<Record<string, string>>;
  /** More machine-readable fields of the body, beside `error` and `message`. */
  readonly fields?: Readonly<Record<string, string | number>>;
}

export type Checked<T> = { readonly ok: true; readonly value: T } | { readonly ok: false; readonly rejection: Rejection };

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

function rejection(status: number, error: string, message: string, headers?: Readonly<Record<string, string>>): { ok: false; rejection: Rejection } {
  return { ok: false, rejection: headers ? { status, error, message, headers } : { status, error, message } };
}

export function unauthenticated(message: string, tokenError = false): { ok: false; rejection: Rejection } {
  const challenge = tokenError ? 'Bearer realm="phaseline", error="invalid_token"' : 'Bearer realm="phaseline"';
  return rejection(401, 'unauthenticated', message, { 'WWW-Authenticate': challenge });
}

/** RFC 6750 token characters; a Firebase ID token (a JWT) always fits. */
const BEARER_TOKEN = /^[A-Za-z0-9\-._~+/]+=*$/;

/** The token from `Authorization: Bearer <token>` (the scheme is case-insensitive). */
export function bearerToken(header: string | undefined): Checked<string> {
  if (header === undefined || header.trim() === '') {
    return unauthenticated('Missing Authorization header: send "Authorization: Bearer <Firebase ID token>"');
  }
  const [scheme = '', ...rest] = header.trim().split(/\s+/);
  if (scheme.toLowerCase() !== 'bearer') {
    return unauthenticated('The Authorization header must use the Bearer scheme: "Authorization: Bearer <Firebase ID token>"');
  }
  const [token, ...extra] = rest;
  if (token === undefined) return unauthenticated('The Authorization header has no token after "Bearer"');
  if (extra.length > 0 || !BEARER_TOKEN.test(token)) {
    return unauthenticated('The Authorization header is malformed: expected "Bearer" followed by one Firebase ID token', true);
  }
  return { ok: true, value: token };
}

/** Only JSON is accepted, in UTF-8 (the only charset JSON over HTTP may use). */
export function checkContentType(header: string | undefined): Rejection | null {
  const [mediaType = '', ...parameters] = (header ?? '').split(';');
  const got = header === undefined ? 'no Content-Type' : `"${header.slice(0, 100)}"`;
  if (mediaType.trim().toLowerCase() !== 'application/json') {
    return { status: 415, error: 'unsupported_media_type', message: `Content-Type must be application/json; got ${got}` };
  }
  for (const parameter of parameters) {
    const [name = '', value = ''] = parameter.split('=');
    const charset = value.trim().replace(/^"|"$/g, '').toLowerCase();
    if (name.trim().toLowerCase() === 'charset' && charset !== 'utf-8' && charset !== 'utf8') {
      return { status: 415, error: 'unsupported_media_type', message: `The body must be UTF-8 JSON; got ${got}` };
    }
  }
  return null;
}

function tooLarge(bytes: number, limitBytes: number): { ok: false; rejection: Rejection } {
  return rejection(413, 'payload_too_large', `The body is ${bytes} bytes; the limit is ${limitBytes} bytes (${limitBytes / 1024} KiB)`);
}

const EMPTY_BODY = 'The body is empty: send a JSON object like {"pipeline": "<name>", "input": {...}}';

function parseJsonBytes(bytes: Uint8Array, limitBytes: number): Checked<unknown> {
  if (bytes.byteLength > limitBytes) return tooLarge(bytes.byteLength, limitBytes);
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    return rejection(400, 'invalid_json', 'The body is not valid UTF-8 text');
  }
  if (text.trim() === '') return rejection(400, 'invalid_json', EMPTY_BODY);
  try {
    return { ok: true, value: JSON.parse(text) as unknown };
  } catch (error) {
    return rejection(400, 'invalid_json', `The body is not valid JSON: ${error instanceof Error ? error.message : String(error)}`);
  }
}

/**
 * The JSON body, every endpoint's (submit, the owner's actions, the operator's). The framework may
 * already have parsed it (and answered nothing about a parse failure), so the raw bytes are parsed
 * here whenever they were kept; a parsed `body` is the fallback, measured by its serialized size.
 * (firebase-tools' functions emulator runs body-parser first, which answers malformed JSON itself
 * with a 400 of its own before this handler is called.) Text that is not well-formed (a lone
 * surrogate, which JSON's `\ud800` escape can carry) is refused here, once for every endpoint:
 * schemas accept it, Firestore refuses to store it, and the caller would be told of a fault of ours.
 */
export function readJsonBody(request: Pick<HttpRequest, 'body' | 'rawBody'>, limitBytes = SUBMIT_BODY_LIMIT_BYTES): Checked<unknown> {
  const parsed = parseBody(request, limitBytes);
  if (!parsed.ok) return parsed;
  const where = illFormedTextAt(parsed.value);
  if (where !== null) {
    return rejection(400, 'invalid_text', `The body has text that is not well-formed Unicode (a lone surrogate, such as "\\ud800") ${where}: send well-formed text`);
  }
  return parsed;
}

function parseBody(request: Pick<HttpRequest, 'body' | 'rawBody'>, limitBytes: number): Checked<unknown> {
  const { rawBody, body } = request;
  if (rawBody !== undefined) return parseJsonBytes(rawBody, limitBytes);
  if (Buffer.isBuffer(body)) return parseJsonBytes(body, limitBytes);
  if (typeof body === 'string') return parseJsonBytes(Buffer.from(body, 'utf8'), limitBytes);
  if (body === undefined) return rejection(400, 'invalid_json', EMPTY_BODY);
  const bytes = Buffer.byteLength(JSON.stringify(body));
  if (bytes > limitBytes) return tooLarge(bytes, limitBytes);
  return { ok: true, value: body };
}

/** Node 20+ has it; the project's TypeScript library (es2023) does not declare it yet. */
const isWellFormed = (text: string): boolean => (text as string & { isWellFormed(): boolean }).isWellFormed();

interface Visit {
  readonly value: unknown;
  readonly parent: Visit | null;
  readonly key: string | number | null;
}

/** `input.recipients[1].name` for a visit; built only for a refusal, so a deep body costs no path per node. */
function pathOf(visit: Visit | null): string {
  const parts: string[] = [];
  for (let at = visit; at !== null && at.key !== null; at = at.parent) {
    parts.push(typeof at.key === 'number' ? `[${at.key}]` : /^[A-Za-z_$][\w$]*$/.test(at.key) ? `.${at.key}` : `[${JSON.stringify(at.key)}]`);
  }
  return parts.reverse().join('').replace(/^\./, '');
}

/**
 * Where the first ill-formed string of a parsed JSON value is ("at input.text", "in a field name
 * in input"), or null when every string and field name is well-formed. Iterative: a deeply nested
 * body cannot exhaust the stack.
 */
export function illFormedTextAt(root: unknown): string | null {
  const pending: Visit[] = [{ value: root, parent: null, key: null }];
  for (let visit = pending.pop(); visit !== undefined; visit = pending.pop()) {
    const { value } = visit;
    if (typeof value === 'string') {
      if (!isWellFormed(value)) return visit.parent === null ? 'in the body itself' : `at ${pathOf(visit)}`;
    } else if (Array.isArray(value)) {
      for (let index = value.length - 1; index >= 0; index -= 1) pending.push({ value: value[index] as unknown, parent: visit, key: index });
    } else if (typeof value === 'object' && value !== null) {
      const entries = Object.entries(value);
      for (const [key] of entries) {
        if (!isWellFormed(key)) return `in a field name in ${visit.parent === null ? 'the body' : pathOf(visit)}`;
      }
      for (let index = entries.length - 1; index >= 0; index -= 1) {
        const [key, child] = entries[index] ?? [];
        if (key !== undefined) pending.push({ value: child, parent: visit, key });
      }
    }
  }
  return null;
}

export function reply(response: HttpResponse, refusal: Rejection): void {
  for (const [name, value] of Object.entries(refusal.headers ?? {})) response.set(name, value);
  response.status(refusal.status).json({ ...refusal.fields, error: refusal.error, message: refusal.message });
}

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

  async function handle(request: HttpRequest, response: HttpResponse): Promise<void> {
    if (request.method === 'OPTIONS') {
      answerPreflight(response);
      return;
    }
    if (request.method !== 'POST') {
      reply(response, {
        status: 405,
        error: 'method_not_allowed',
        message: `Method ${request.method} is not allowed: submit a job with POST`,
        headers: { Allow: CORS_ALLOWED_METHODS },
      });
      return;
    }

    // Who is asking comes first: an anonymous caller learns nothing about what a valid body is.
    const token = bearerToken(request.get('authorization'));
    if (!token.ok) return reply(response, token.rejection);
    let caller: PipelineCaller;
    try {
      caller = callerOf(await deps.verifyToken(token.value));
    } catch (error) {
      logger.warn('submitJob: ID token rejected', { reason: describeError(error) });
      return reply(response, unauthenticated('The ID token was rejected (expired, revoked, malformed or for another project): sign in again', true).rejection);
    }
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

  return async (request, response) => {
    applyCorsHeaders(request, response);
    try {
      await handle(request, response);
    } catch (error) {
      logger.error('submitJob: internal error', { error: describeError(error), stack: error instanceof Error ? error.stack : undefined });
      reply(response, {
        status: 500,
        error: 'internal',
        message: 'The job could not be submitted because of an internal error; retrying with the same Idempotency-Key is safe',
      });
    }
  };
}
