/**
 * The three HTTP functions the page calls, with the caller's ID token. Network failures, 429 and
 * 5xx answers are retried a few times; a submission keeps its Idempotency-Key across every retry,
 * so a retry whose first try did get through finds the same job instead of making a second one.
 * A 429 for one of the user's limits (`quota_exceeded`) is not retried: its sentence is shown.
 */
import type { PageConfig } from './config';

/** A user's limit frees when a job ends or a minute passes, not within these few retries. */
const QUOTA_EXCEEDED = 'quota_exceeded';

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    /** For a limit reached (`quota_exceeded`): seconds until a new try may be accepted. */
    readonly retryAfterSeconds: number | null = null,
  ) {
    super(message);
    this.name = 'ApiError';
  }

  /** One of the user's limits refused the request: retrying before `retryAfterSeconds` is refused again. */
  get limitReached(): boolean {
    return this.status === 429 && this.code === QUOTA_EXCEEDED;
  }
}

export interface ResearchRequest {
  readonly question: string;
  readonly experts: number;
  readonly sections: number;
  readonly wordsPerSection: number;
}

export interface SubmitAnswer {
  readonly taskId: string;
  readonly status: string;
  readonly statusPath: string;
}

export interface Api {
  submit(request: ResearchRequest, idempotencyKey: string, conversationId: string): Promise<SubmitAnswer>;
  cancel(jobId: string, reason: string): Promise<void>;
  decide(jobId: string, questionId: string, answer: string): Promise<void>;
}

const ATTEMPTS = 4;
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));


function retryable(status: number, code: string): boolean {
  return (status === 429 && code !== QUOTA_EXCEEDED) || status >= 500;
}

export function createApi(config: PageConfig, idToken: () => Promise<string>): Api {
  async function post(name: string, body: unknown, headers: Readonly<Record<string, string>> = {}): Promise<unknown> {
    let lastError: Error = new Error(`${name} was not called`);
    for (let attempt = 1; attempt <= ATTEMPTS; attempt += 1) {
      if (attempt > 1) await sleep(400 * 2 ** (attempt - 2));
      let response: Response;
      try {
        response = await fetch(`${config.functionsBaseUrl}/${name}`, {
          method: 'POST',
          headers: { authorization: `Bearer ${await idToken()}`, 'content-type': 'application/json', ...headers },
          body: JSON.stringify(body),
        });
      } catch (error) {
        lastError = new ApiError(0, 'network', `Could not reach ${name}: ${error instanceof Error ? error.message : String(error)}`);
        continue;
      }
      const payload: unknown = await response.json().catch(() => null);
      if (response.ok) return payload;
      const fields = typeof payload === 'object' && payload !== null ? (payload as Readonly<Record<string, unknown>>) : {};
      const message = typeof fields.message === 'string' ? fields.message : `${name} answered ${response.status}`;
      const code = typeof fields.error === 'string' ? fields.error : 'http_error';
      const retryAfter = typeof fields.retryAfterSeconds === 'number' && Number.isFinite(fields.retryAfterSeconds) ? Math.max(0, fields.retryAfterSeconds) : null;
      lastError = new ApiError(response.status, code, message, retryAfter);
      if (!retryable(response.status, code)) break;
    }
    throw lastError;
  }

  return {
    async submit(request, idempotencyKey, conversationId) {
      const answer = await post('submitJob', { pipeline: 'research', input: request, conversationId }, { 'idempotency-key': idempotencyKey });
      const fields = typeof answer === 'object' && answer !== null ? (answer as Readonly<Record<string, unknown>>) : {};
      if (typeof fields.taskId !== 'string') throw new ApiError(502, 'bad_answer', 'submitJob answered without a task ID');
      return { taskId: fields.taskId, status: String(fields.status), statusPath: String(fields.statusPath) };
    },
    async cancel(jobId, reason) {
      await post('cancelJob', { jobId, reason });
    },
    async decide(jobId, questionId, answer) {
      await post('decideJob', { jobId, questionId, answer });
    },
  };
}
