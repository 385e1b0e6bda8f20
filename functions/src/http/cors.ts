/**
 * CORS for a browser frontend, done in the handler (not by the `cors` option of onRequest) so the
 * same code answers in production, under the emulator and when tests call the handler directly.
 * Callers authenticate with a bearer token, never cookies, so no credentials mode is needed.
 */

/** The parts of a request and response CORS needs; express objects and test fakes both fit. */
export interface CorsRequest {
  readonly method: string;
  get(name: string): string | undefined;
}

export interface CorsResponse {
  set(field: string, value: string): unknown;
  status(code: number): { end(): unknown };
}

export const CORS_ALLOWED_METHODS = 'POST, OPTIONS';
export const CORS_ALLOWED_HEADERS = 'Authorization, Content-Type, Idempotency-Key';
/**
 * Answer headers that cross-origin scripts may read. Browsers hide every header outside the
 * CORS-safelisted few unless it is listed here: the replay marker of the submit contract, the
 * token challenge of a 401, and the wait of a 429/503.
 */
export const CORS_EXPOSED_HEADERS = 'Idempotent-Replayed, WWW-Authenticate, Retry-After';
/** How long a browser may cache a preflight answer. */
export const CORS_MAX_AGE_SECONDS = 3600;

/** Set on every response: echoes the caller's origin (any origin may call; the token decides who). */
export function applyCorsHeaders(request: CorsRequest, response: CorsResponse): void {
  const origin = request.get('origin');
  if (origin) {
    response.set('Access-Control-Allow-Origin', origin);
    response.set('Vary', 'Origin');
  } else {
    response.set('Access-Control-Allow-Origin', '*');
  }
  // Only the actual answer's list counts; a preflight answer carrying it would mean nothing.
  if (request.method !== 'OPTIONS') response.set('Access-Control-Expose-Headers', CORS_EXPOSED_HEADERS);
}

/** Answers an OPTIONS preflight: 204 with what the endpoint accepts. */
export function answerPreflight(response: CorsResponse): void {
  response.set('Access-Control-Allow-Methods', CORS_ALLOWED_METHODS);
  response.set('Access-Control-Allow-Headers', CORS_ALLOWED_HEADERS);
  response.set('Access-Control-Max-Age', String(CORS_MAX_AGE_SECONDS));
  response.set('Allow', CORS_ALLOWED_METHODS);
  response.status(204).end();
}
