/**
 * CORS answers of the HTTP functions (functions/src/http/cors.ts). A browser shows a cross-origin
 * script only the CORS-safelisted answer headers plus those listed in
 * Access-Control-Expose-Headers, so every header of the contract that a page must read is listed.
 * The same headers read by page JavaScript in real Chromium: test/e2e/browser.test.ts.
 */
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { answerPreflight, applyCorsHeaders, type CorsRequest } from '../../functions/src/http/cors';
import { createSubmitHandler } from '../../functions/src/http/submit-handler';
import { RecordingResponse } from '../support/http';

class ExposingResponse extends RecordingResponse {
  /** The header names a cross-origin script may read, lower-cased. */
  get exposed(): string[] {
    const list = this.headers.get('access-control-expose-headers') ?? '';
    return list
      .split(',')
      .map((name) => name.trim().toLowerCase())
      .filter((name) => name.length > 0);
  }
}

function corsRequest(method: string, headers: Readonly<Record<string, string>> = {}): CorsRequest {
  const lowered = new Map(Object.entries(headers).map(([name, value]) => [name.toLowerCase(), value]));
  return { method, get: (name) => lowered.get(name.toLowerCase()) };
}

test('bug 7: an answer to a cross-origin POST exposes Idempotent-Replayed, WWW-Authenticate and Retry-After', () => {
  for (const headers of [{ origin: 'https://chat.example' }, {}]) {
    const response = new ExposingResponse();
    applyCorsHeaders(corsRequest('POST', headers), response);
    expect(response.exposed).toEqual(expect.arrayContaining(['idempotent-replayed', 'www-authenticate', 'retry-after']));
  }
});

test('bug 7: a 401 from submitJob carries its WWW-Authenticate challenge where a page can read it', async () => {
  const handle = createSubmitHandler({
    store: { createJob: () => Promise.reject(new Error('an unauthenticated request must not reach the store')) },
    queue: { enqueue: () => Promise.reject(new Error('an unauthenticated request must not enqueue')) },
    verifyToken: () => Promise.reject(new Error('no token is valid here')),
    pipelines: pipelineRegistry(),
  });
  const response = new ExposingResponse();
  await handle({ method: 'POST', get: (name) => (name.toLowerCase() === 'origin' ? 'https://chat.example' : undefined) }, response);
  expect(response.statusCode).toBe(401);
  expect(response.headers.get('www-authenticate')).toMatch(/^Bearer /);
  expect(response.headers.get('access-control-allow-origin')).toBe('https://chat.example');
  expect(response.exposed).toContain('www-authenticate');
});

test('a preflight answer lists what may be sent; what may be read is listed on the actual answer only', () => {
  const request = corsRequest('OPTIONS', { origin: 'https://chat.example', 'access-control-request-method': 'POST' });
  const response = new ExposingResponse();
  applyCorsHeaders(request, response);
  answerPreflight(response);
  expect(response.statusCode).toBe(204);
  expect(response.headers.get('access-control-allow-headers')).toBe('Authorization, Content-Type, Idempotency-Key');
  expect(response.headers.has('access-control-expose-headers')).toBe(false);
});
