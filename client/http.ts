/**
 * The three HTTP functions a frontend calls (`submitJob`, `cancelJob`, `decideJob`), with the
 * caller's Firebase ID token, exactly as functions/src/http/submit-handler.ts and
 * job-actions-handler.ts answer them. A submission keeps its Idempotency-Key across every retry, so
 * a retry whose first try did get through (its answer lost on the way back) finds the same job
 * instead of making a second one. When to retry: retry.ts.
 */
import { DEFAULT_RETRY_POLICY, isRetryable, parseRetryAfter, QUOTA_EXCEEDED, retryDelayMs, systemRetryClock, type RetryClock, type RetryPolicy } from './retry';

/**
 * A refusal or failure of a call: the HTTP status (0 when no answer arrived), the body's stable
 * `error` code and its sentence for people.
 */
export class PhaselineApiError extends Error {
  constructor(
    /** The HTTP status; 0 when no answer arrived (network failure, aborted). */
    readonly status: number,
    /** The stable code: the body's `error` (`invalid_request`, `quota_exceeded`, `not_found`, ...), or `network`, `aborted`, `bad_answer`. */
    readonly code: string,
    message: string,
    /** When the server said when to try again (`Retry-After`, or the body's `retryAfterSeconds`): seconds from the answer. */
    readonly retryAfterSeconds: number | null = null,
    /** Tries made before giving up. */
    readonly attempts = 1,
    /** The body's other fields (a 429's `limit` and `allowed`, for example). */
    readonly details: Readonly<Record<string, unknown>> = {},
  ) {
    super(message);
    this.name = 'PhaselineApiError';
  }

  /** One of the person's limits refused the request: a new try before `retryAfterSeconds` is refused again. */
  get limitReached(): boolean {
    return this.status === 429 && this.code === QUOTA_EXCEEDED;
  }

  /** Whether the same request may succeed later (no answer, a 5xx, a 429 that is not the person's limit). */
  get retryable(): boolean {
    return this.code !== 'aborted' && isRetryable(this);
  }
}

/** The few members of a fetch Response the client reads. */
export interface FetchResponseLike {
  readonly status: number;
  readonly ok: boolean;
  readonly headers: { get(name: string): string | null };
  json(): Promise<unknown>;
}

/** The fetch the client calls: the platform's by default; tests hand in their own. */
export type FetchLike = (
  url: string,
  init: { readonly method: 'POST'; readonly headers: Record<string, string>; readonly body: string; readonly signal?: AbortSignal },
) => Promise<FetchResponseLike>;

/** What a frontend submits: a pipeline's name and its input, and optionally its key and conversation. */
export interface SubmitRequest<Input = unknown> {
  readonly pipeline: string;
  readonly input: Input;
  /**
   * The Idempotency-Key (1 to 200 printable ASCII characters). Store it with the message before
   * submitting: a resend after a reload with the same key finds the same job. One is made when absent.
   */
  readonly idempotencyKey?: string;
  /** Publishes the answer to `conversations/{conversationId}/messages/{jobId}` (owned by the caller). */
  readonly conversationId?: string;
}

/** The accepted submission (a `202`). */
export interface SubmitAnswer {
  /** The job's ID (the wire's `taskId`). */
  readonly jobId: string;
  /** `queued` for a new job; a replayed submission answers the job's status when it was first accepted. */
  readonly status: string;
  /** The job document to watch: `jobs/{jobId}`. */
  readonly statusPath: string;
  /** True when the server answered with an earlier submission's job (`Idempotent-Replayed: true`). */
  readonly replayed: boolean;
  /** The key sent with every try. */
  readonly idempotencyKey: string;
}

/** The accepted cancel (a `200`). */
export interface CancelAnswer {
  readonly jobId: string;
  readonly status: string;
  /** Effects in flight when the job stopped, whose outcome is checked before anything else happens to them. */
  readonly unknownEffects: number;
  /** A sentence about what the cancel stopped (phase, sections done, effects). */
  readonly report: string | null;
}

/** The accepted answer to a question (a `200`): the job goes on. */
export interface AnswerAnswer {
  readonly jobId: string;
  readonly status: string;
}

/** Per call: an abort signal that stops the call and its retries. */
export interface CallOptions {
  readonly signal?: AbortSignal;
}

/** The HTTP side of the client. */
export interface PhaselineApi {
  /** Submits a job with an Idempotency-Key; retries reuse it. */
  submit<Input>(request: SubmitRequest<Input>, options?: CallOptions): Promise<SubmitAnswer>;
  /**
   * Cancels the caller's job. A `409` means it had already ended; after a lost answer the first
   * try may be the one that ended it, which the job's own status then shows.
   */
  cancel(jobId: string, reason?: string, options?: CallOptions): Promise<CancelAnswer>;
  /** Answers the question a job waits on (`questionId` and one of its `options`). */
  answer(jobId: string, questionId: string, answer: string, options?: CallOptions): Promise<AnswerAnswer>;
}

/** Where the functions are and who calls them. */
export interface PhaselineApiOptions {
  /**
   * The base the function names are appended to: `https://<region>-<project>.cloudfunctions.net`
   * deployed, `http://127.0.0.1:5001/<project>/<region>` on the emulator.
   */
  readonly functionsBaseUrl: string;
  /** A current Firebase ID token of the signed-in user; called for every try (tokens refresh). */
  readonly idToken: () => Promise<string>;
  readonly fetch?: FetchLike;
  readonly clock?: RetryClock;
  /** Jitter for the client's own backoff; 0 to 1. */
  readonly random?: () => number;
  readonly retry?: Partial<RetryPolicy>;
}

/** A new random Idempotency-Key (a version 4 UUID). */
export function newIdempotencyKey(): string {
  if (typeof crypto.randomUUID === 'function') return crypto.randomUUID();
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  bytes[6] = ((bytes[6] ?? 0) & 0x0f) | 0x40;
  bytes[8] = ((bytes[8] ?? 0) & 0x3f) | 0x80;
  const hex = [...bytes].map((byte) => byte.toString(16).padStart(2, '0')).join('');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

type Fields = Readonly<Record<string, unknown>>;

const fieldsOf = (value: unknown): Fields => (typeof value === 'object' && value !== null && !Array.isArray(value) ? (value as Fields) : {});

const describe = (error: unknown): string => (error instanceof Error ? error.message : String(error));

interface Answered {
  readonly body: Fields;
  readonly headers: FetchResponseLike['headers'];
}

/** Creates the HTTP side of the client. */
export function createPhaselineApi(options: PhaselineApiOptions): PhaselineApi {
  const baseUrl = options.functionsBaseUrl.replace(/\/+$/, '');
  const fetchJson: FetchLike = options.fetch ?? ((url, init) => globalThis.fetch(url, init));
  const clock = options.clock ?? systemRetryClock;
  const random = options.random ?? Math.random;
  const policy: RetryPolicy = { ...DEFAULT_RETRY_POLICY, ...options.retry };

  async function post(name: string, body: unknown, headers: Readonly<Record<string, string>>, signal: AbortSignal | undefined): Promise<Answered> {
    for (let attempt = 1; ; attempt += 1) {
      if (signal?.aborted) throw new PhaselineApiError(0, 'aborted', `${name} was aborted`, null, attempt - 1);
      const error = await tryOnce(name, body, headers, signal, attempt);
      if (!(error instanceof PhaselineApiError)) return error;
      const retryAfterMs = error.retryAfterSeconds === null ? null : error.retryAfterSeconds * 1000;
      const delay = error.code === 'aborted' ? null : retryDelayMs({ status: error.status, code: error.code, retryAfterMs }, attempt, policy, random);
      if (delay === null) throw error;
      try {
        await clock.sleep(delay, signal);
      } catch {
        throw new PhaselineApiError(0, 'aborted', `${name} was aborted while waiting to retry`, null, attempt);
      }
    }
  }

  /** One try: the answer, or the error it ended with. */
  async function tryOnce(name: string, body: unknown, headers: Readonly<Record<string, string>>, signal: AbortSignal | undefined, attempt: number): Promise<Answered | PhaselineApiError> {
    let response: FetchResponseLike;
    try {
      const token = await options.idToken();
      response = await fetchJson(`${baseUrl}/${name}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', ...headers },
        body: JSON.stringify(body),
        ...(signal ? { signal } : {}),
      });
    } catch (error) {
      if (signal?.aborted) return new PhaselineApiError(0, 'aborted', `${name} was aborted`, null, attempt);
      return new PhaselineApiError(0, 'network', `Could not reach ${name}: ${describe(error)}`, null, attempt);
    }
    const payload = fieldsOf(await response.json().catch(() => null));
    if (response.ok) return { body: payload, headers: response.headers };
    const { error: code, message, ...details } = payload;
    const headerMs = parseRetryAfter(response.headers.get('retry-after'), clock.now());
    const bodySeconds = typeof payload.retryAfterSeconds === 'number' && Number.isFinite(payload.retryAfterSeconds) ? Math.max(0, payload.retryAfterSeconds) : null;
    const retryAfterSeconds = headerMs === null ? bodySeconds : Math.ceil(headerMs / 1000);
    return new PhaselineApiError(
      response.status,
      typeof code === 'string' ? code : 'http_error',
      typeof message === 'string' ? message : `${name} answered ${response.status}`,
      retryAfterSeconds,
      attempt,
      details,
    );
  }

  const text = (body: Fields, name: string, what: string): string => {
    const value = body[name];
    if (typeof value !== 'string') throw new PhaselineApiError(502, 'bad_answer', `${what} answered without a ${name}`);
    return value;
  };

  return {
    async submit(request, callOptions = {}) {
      const idempotencyKey = request.idempotencyKey ?? newIdempotencyKey();
      const body = { pipeline: request.pipeline, input: request.input, ...(request.conversationId === undefined ? {} : { conversationId: request.conversationId }) };
      const answer = await post('submitJob', body, { 'idempotency-key': idempotencyKey }, callOptions.signal);
      return {
        jobId: text(answer.body, 'taskId', 'submitJob'),
        status: text(answer.body, 'status', 'submitJob'),
        statusPath: text(answer.body, 'statusPath', 'submitJob'),
        replayed: answer.headers.get('idempotent-replayed') === 'true',
        idempotencyKey,
      };
    },
    async cancel(jobId, reason, callOptions = {}) {
      const answer = await post('cancelJob', reason === undefined ? { jobId } : { jobId, reason }, {}, callOptions.signal);
      const { unknownEffects, report } = answer.body;
      return {
        jobId: text(answer.body, 'jobId', 'cancelJob'),
        status: text(answer.body, 'status', 'cancelJob'),
        unknownEffects: typeof unknownEffects === 'number' ? unknownEffects : 0,
        report: typeof report === 'string' ? report : null,
      };
    },
    async answer(jobId, questionId, answer, callOptions = {}) {
      const answered = await post('decideJob', { jobId, questionId, answer }, {}, callOptions.signal);
      return { jobId: text(answered.body, 'jobId', 'decideJob'), status: text(answered.body, 'status', 'decideJob') };
    },
  };
}
