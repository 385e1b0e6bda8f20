/**
 * What every endpoint (submitJob, cancelJob, decideJob, opsAction) does before its own work, in
 * one place: a CORS preflight answered and any method but POST refused, the caller's ID token read
 * and verified, the content type checked and the JSON body read within its limit and with
 * well-formed text. Each refusal is a JSON `{ error, message }` whose status names the problem;
 * `answering` makes any other failure a logged 500 with the endpoint's own sentence.
 *
 * The request and response types are the few members used, so the express objects from
 * firebase-functions fit them and tests can pass plain objects.
 */
import { describeError } from '../core/errors';
import { answerPreflight, applyCorsHeaders, CORS_ALLOWED_METHODS } from './cors';

/** The largest body an endpoint accepts (a submission's), measured on the raw bytes when the framework kept them; the actions take less. */
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

export interface OpeningLogger {
  warn(message: string, fields?: Record<string, unknown>): void;
}

/** How one endpoint opens a request. */
export interface Opening<Identity> {
  /** The endpoint as log lines name it ("submitJob"). */
  readonly endpoint: string;
  /** What the 405 for another method tells the caller to do ("use POST"). */
  readonly usePost: string;
  readonly verifyToken: (token: string) => Promise<Identity>;
  /** The 401's sentence when the verifier rejects the token. */
  readonly tokenRejected: string;
  readonly logger: OpeningLogger;
}

/**
 * The opening every endpoint shares: the preflight answered, a method other than POST refused, the
 * bearer token read and verified. Resolves to who the token names, or to null once it has answered
 * the request itself. Who is asking comes before anything about the body: an unknown caller learns
 * nothing about what a valid one is.
 */
export async function openRequest<Identity>(request: HttpRequest, response: HttpResponse, opening: Opening<Identity>): Promise<Identity | null> {
  if (request.method === 'OPTIONS') {
    answerPreflight(response);
    return null;
  }
  if (request.method !== 'POST') {
    reply(response, { status: 405, error: 'method_not_allowed', message: `Method ${request.method} is not allowed: ${opening.usePost}`, headers: { Allow: CORS_ALLOWED_METHODS } });
    return null;
  }
  const token = bearerToken(request.get('authorization'));
  if (!token.ok) {
    reply(response, token.rejection);
    return null;
  }
  try {
    return await opening.verifyToken(token.value);
  } catch (error) {
    opening.logger.warn(`${opening.endpoint}: ID token rejected`, { reason: describeError(error) });
    reply(response, unauthenticated(opening.tokenRejected, true).rejection);
    return null;
  }
}

/** The handler as the platform calls it: CORS headers on every answer, and a failure of ours a logged 500 that says `internalMessage`. */
export function answering(
  endpoint: string,
  logger: { error(message: string, fields?: Record<string, unknown>): void },
  internalMessage: string,
  handle: (request: HttpRequest, response: HttpResponse) => Promise<void>,
): (request: HttpRequest, response: HttpResponse) => Promise<void> {
  return async (request, response) => {
    applyCorsHeaders(request, response);
    try {
      await handle(request, response);
    } catch (error) {
      logger.error(`${endpoint}: internal error`, { error: describeError(error), stack: error instanceof Error ? error.stack : undefined });
      reply(response, { status: 500, error: 'internal', message: internalMessage });
    }
  };
}
