/**
 * An effect adapter for HTTP systems of record that honour idempotency keys the way payment and
 * messaging APIs do:
 *
 *   POST {baseUrl}/effects            body { intent }, header Idempotency-Key: <key>
 *        2xx  applied (a replay of the same key answers the stored result)
 *        409  a request with this key is still being processed            -> unknown
 *        422  the key was used with a different request                   -> rejected
 *        429, 503  not processed: come back later                         -> unavailable
 *        other 4xx  refused                                               -> rejected
 *        other 5xx, a timeout, a dropped connection                       -> unknown
 *        connection refused, no such host                                 -> unavailable (nothing was sent)
 *   GET  {baseUrl}/effects/{key}
 *        200 found (with evidence), 404 not found, anything else          -> cannot tell
 *
 * The 503 reading is part of the contract with the target: it answers 503 only for requests it did
 * not process. The classifiers are exported as pure functions for the unit tests.
 */
import { z } from 'zod';
import { describeError } from '../core/errors';
import { parseRetryAfter } from '../core/server-delay';
import { canonicalJson } from '../core/effect-keys';
import type { EffectEvidence, EffectIntent } from './ledger';
import type { ApplyOutcome, EffectAdapter, LookupOutcome } from './port';

/** The HTTP adapter's settings: base URL, request timeout, and the name questions use for the target. */
export interface HttpEffectAdapterOptions {
  readonly baseUrl: string;
  /** Each request's own deadline; the caller's signal can end it sooner. */
  readonly timeoutMs: number;
  readonly name?: string;
  readonly fetch?: typeof fetch;
  /** Resolves a Retry-After given as a date; the system clock by default. */
  readonly now?: () => number;
}

const appliedBody = z.object({ effectId: z.string().min(1), appliedAtMs: z.number(), replayed: z.boolean().optional() });

function evidenceFrom(name: string, status: number, body: z.infer<typeof appliedBody>): EffectEvidence {
  return { target: name, effectId: body.effectId, appliedAtMs: body.appliedAtMs, replayed: body.replayed ?? false, status };
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

export function classifyApplyResponse(name: string, status: number, bodyText: string, retryAfter: number | null): ApplyOutcome {
  if (status >= 200 && status < 300) {
    const body = appliedBody.safeParse(parseJson(bodyText));
    // A 2xx without readable evidence: the lookup will supply it.
    if (!body.success) return { kind: 'unknown', reason: `${name} answered ${status} without readable evidence` };
    return { kind: 'applied', evidence: evidenceFrom(name, status, body.data) };
  }
  if (status === 409) return { kind: 'unknown', reason: `${name} is still processing a request with this key (409)` };
  if (status === 429 || status === 503) {
    return { kind: 'unavailable', reason: `${name} answered ${status}`, ...(retryAfter === null ? {} : { retryAfterMs: retryAfter }) };
  }
  if (status === 422) return { kind: 'rejected', reason: `${name} refused the key: it was used for a different request (422)` };
  if (status >= 400 && status < 500) return { kind: 'rejected', reason: `${name} refused the request (${status}${snippet(bodyText)})` };
  return { kind: 'unknown', reason: `${name} answered ${status}${snippet(bodyText)}` };
}

export function classifyLookupResponse(name: string, status: number, bodyText: string): LookupOutcome {
  if (status === 404) return { kind: 'not-found' };
  if (status === 200) {
    const body = appliedBody.safeParse(parseJson(bodyText));
    if (body.success) return { kind: 'found', evidence: evidenceFrom(name, status, body.data) };
    return { kind: 'unreachable', reason: `${name} answered the lookup without readable evidence` };
  }
  return { kind: 'unreachable', reason: `${name} answered the lookup with ${status}` };
}

/** Error codes that mean the request never reached the target. */
const NOT_SENT_CODES = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH']);

function errorCode(error: unknown): string | undefined {
  for (let current: unknown = error, depth = 0; current !== null && typeof current === 'object' && depth < 5; depth += 1) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === 'string') return code;
    const errors = (current as { errors?: unknown }).errors;
    if (Array.isArray(errors) && errors.length > 0) current = errors[0] as unknown;
    else current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

export function classifyTransportError(name: string, error: unknown, timeoutMs: number): Extract<ApplyOutcome, { kind: 'unavailable' | 'unknown' }> {
  const code = errorCode(error);
  if (code !== undefined && NOT_SENT_CODES.has(code)) return { kind: 'unavailable', reason: `${name} cannot be reached (${code})` };
  // By name, not instanceof: fetch's DOMException may come from another realm.
  if ((error as { name?: unknown } | null)?.name === 'TimeoutError') return { kind: 'unknown', reason: `no answer from ${name} within ${timeoutMs} ms` };
  return { kind: 'unknown', reason: `the connection to ${name} failed (${code ?? describeError(error)})` };
}

function snippet(text: string): string {
  const trimmed = text.trim().slice(0, 120);
  return trimmed === '' ? '' : `: ${trimmed}`;
}

/** An effect adapter for a system of record over HTTP: POST /effects with an Idempotency-Key, GET /effects/{key} to look one up. */
export function createHttpEffectAdapter(options: HttpEffectAdapterOptions): EffectAdapter {
  const base = options.baseUrl.replace(/\/+$/, '');
  const name = options.name ?? `receiver at ${base}`;
  const fetchImpl = options.fetch ?? fetch;
  const now = options.now ?? Date.now;

  /** Runs one request; a caller's abort is rethrown (the caller lost its claim), a timeout is not. */
  async function exchange(signal: AbortSignal, url: string, init: RequestInit): Promise<{ status: number; text: string; retryAfter: string | null } | { error: unknown }> {
    const combined = AbortSignal.any([signal, AbortSignal.timeout(options.timeoutMs)]);
    try {
      const response = await fetchImpl(url, { ...init, signal: combined });
      const text = await response.text();
      return { status: response.status, text, retryAfter: response.headers.get('retry-after') };
    } catch (error) {
      signal.throwIfAborted();
      return { error };
    }
  }

  return {
    name,
    sendTimeoutMs: options.timeoutMs,
    async apply(intent: EffectIntent, idempotencyKey: string, signal: AbortSignal): Promise<ApplyOutcome> {
      const answer = await exchange(signal, `${base}/effects`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': idempotencyKey },
        // Canonical: a retry sends byte-for-byte the same body, whatever order the ledger stored it in.
        body: canonicalJson({ intent }),
      });
      if ('error' in answer) return classifyTransportError(name, answer.error, options.timeoutMs);
      // Parsed only (finite, non-negative); the caller caps it against its own limit before waiting on it.
      return classifyApplyResponse(name, answer.status, answer.text, parseRetryAfter(answer.retryAfter, now()));
    },
    async lookup(idempotencyKey: string, signal: AbortSignal): Promise<LookupOutcome> {
      const answer = await exchange(signal, `${base}/effects/${encodeURIComponent(idempotencyKey)}`, { method: 'GET' });
      if ('error' in answer) {
        return { kind: 'unreachable', reason: classifyTransportError(name, answer.error, options.timeoutMs).reason };
      }
      return classifyLookupResponse(name, answer.status, answer.text);
    },
  };
}
