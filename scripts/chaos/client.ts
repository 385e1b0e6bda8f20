/**
 * The soak's users, as a chat frontend would be: an account on the Auth emulator (its REST
 * signUp: anonymous, or signed in with a password and granted pipelines as an operator would),
 * submissions over HTTP with an Idempotency-Key that stays the same across retries, answers to a
 * waiting job's question, and cancellations.
 */
import { randomBytes } from 'node:crypto';
import { PIPELINE_GRANTS_CLAIM } from '../../functions/src/core/pipeline';
import type { WebConfig } from '../lib/local-stack';

export interface User {
  readonly uid: string;
  readonly idToken: string;
}

export async function signUp(config: WebConfig): Promise<User> {
  const response = await fetch(`${config.authEmulatorUrl}/identitytoolkit.googleapis.com/v1/accounts:signUp?key=${config.apiKey}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ returnSecureToken: true }),
    signal: AbortSignal.timeout(15_000),
  });
  const body = (await response.json()) as { idToken?: string; localId?: string; error?: { message?: string } };
  if (!response.ok || !body.idToken || !body.localId) throw new Error(`Auth emulator signUp answered ${response.status}: ${body.error?.message ?? JSON.stringify(body)}`);
  return { uid: body.localId, idToken: body.idToken };
}

async function identityToolkit(config: WebConfig, path: string, body: unknown, headers: Readonly<Record<string, string>> = {}): Promise<Record<string, unknown>> {
  const response = await fetch(`${config.authEmulatorUrl}/identitytoolkit.googleapis.com/v1/${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(15_000),
  });
  const answer = (await response.json()) as Record<string, unknown> & { error?: { message?: string } };
  if (!response.ok) throw new Error(`Auth emulator ${path} answered ${response.status}: ${answer.error?.message ?? JSON.stringify(answer)}`);
  return answer;
}

/**
 * A signed-in (password) account an operator granted `pipelines` (the custom claim the functions
 * check, set through the Auth emulator's admin API), with an ID token that carries the grant.
 */
export async function signUpGranted(config: WebConfig, pipelines: readonly string[]): Promise<User> {
  const credentials = { email: `soak-${randomBytes(6).toString('hex')}@example.test`, password: randomBytes(12).toString('hex'), returnSecureToken: true };
  const created = await identityToolkit(config, `accounts:signUp?key=${config.apiKey}`, credentials);
  const uid = typeof created.localId === 'string' ? created.localId : '';
  if (!uid) throw new Error('Auth emulator signUp returned no localId');
  await identityToolkit(config, `projects/${config.projectId}/accounts:update`, { localId: uid, customAttributes: JSON.stringify({ [PIPELINE_GRANTS_CLAIM]: pipelines }) }, { authorization: 'Bearer owner' });
  // A token issued after the claim was set carries it.
  const signedIn = await identityToolkit(config, `accounts:signInWithPassword?key=${config.apiKey}`, credentials);
  if (typeof signedIn.idToken !== 'string') throw new Error('Auth emulator signInWithPassword returned no idToken');
  return { uid, idToken: signedIn.idToken };
}

export interface SubmitAnswer {
  readonly taskId: string;
  readonly tries: number;
  readonly replayed: boolean;
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Posts a submission until it is accepted (202), retrying transport errors, timeouts and 5xx with
 * the same Idempotency-Key for up to `giveUpAfterMs`. A 4xx is final: the body was wrong.
 */
export async function submit(
  config: WebConfig,
  user: User,
  request: { readonly pipeline: string; readonly input: unknown; readonly idempotencyKey: string },
  options: { readonly giveUpAfterMs: number; readonly timeoutMs: number },
): Promise<SubmitAnswer> {
  const deadline = Date.now() + options.giveUpAfterMs;
  let last: string;
  for (let tries = 1; ; tries += 1) {
    try {
      const response = await fetch(`${config.functionsBaseUrl}/submitJob`, {
        method: 'POST',
        headers: { authorization: `Bearer ${user.idToken}`, 'content-type': 'application/json', 'idempotency-key': request.idempotencyKey },
        body: JSON.stringify({ pipeline: request.pipeline, input: request.input }),
        signal: AbortSignal.timeout(options.timeoutMs),
      });
      const body = (await response.json().catch(() => ({}))) as { taskId?: unknown; message?: unknown };
      if (response.status === 202 && typeof body.taskId === 'string') {
        return { taskId: body.taskId, tries, replayed: response.headers.get('idempotent-replayed') === 'true' };
      }
      last = `submitJob answered ${response.status}: ${typeof body.message === 'string' ? body.message : JSON.stringify(body)}`;
      if (response.status < 500) throw new FinalSubmitError(last);
    } catch (error) {
      if (error instanceof FinalSubmitError) throw error;
      last = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    }
    if (Date.now() > deadline) throw new Error(`gave up after ${tries} tries: ${last}`);
    await sleep(Math.min(5_000, 300 * 2 ** Math.min(tries, 4)));
  }
}

class FinalSubmitError extends Error {}

/** Answers the question a job waits on; resolves with the HTTP status (200 accepted, 409 no longer asked). */
export async function decide(config: WebConfig, user: User, jobId: string, questionId: string, answer: string): Promise<number> {
  const response = await fetch(`${config.functionsBaseUrl}/decideJob`, {
    method: 'POST',
    headers: { authorization: `Bearer ${user.idToken}`, 'content-type': 'application/json' },
    body: JSON.stringify({ jobId, questionId, answer }),
    signal: AbortSignal.timeout(30_000),
  });
  await response.text();
  return response.status;
}

/** Cancels a job as its owner; resolves with the HTTP status (200 cancelled, 409 already finished). */
export async function cancel(config: WebConfig, user: User, jobId: string, reason: string): Promise<number> {
  const response = await fetch(`${config.functionsBaseUrl}/cancelJob`, {
    method: 'POST',
    headers: { authorization: `Bearer ${user.idToken}`, 'content-type': 'application/json' },
    body: JSON.stringify({ jobId, reason }),
    signal: AbortSignal.timeout(30_000),
  });
  await response.text();
  return response.status;
}
