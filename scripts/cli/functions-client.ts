/**
 * The HTTP functions a user calls (submitJob, cancelJob, decideJob), with the user's ID token.
 * A refusal comes back as `{ error, message }`; the server's message is what the person reads.
 */
import { CliError, connectionProblem, RefusedError } from './errors';
import type { IdentitySource } from './identity';
import type { Target } from './target';

export interface FunctionAnswer {
  readonly status: number;
  readonly headers: Headers;
  readonly body: unknown;
}

export interface FunctionsClient {
  /** POSTs JSON to the named function; any non-2xx answer is thrown as a RefusedError or CliError. */
  call(name: string, body: unknown, headers?: Readonly<Record<string, string>>): Promise<FunctionAnswer>;
}

export function functionsClient(target: Target, identity: IdentitySource, doFetch: typeof fetch = fetch): FunctionsClient {
  const hint =
    target.kind === 'local'
      ? 'Is the local stack running? Start it with `npm start`.'
      : `Check that the functions are deployed to ${target.projectId} in ${target.region} (or set PHASELINE_FUNCTIONS_URL).`;
  return {
    async call(name, body, headers = {}) {
      const { idToken } = await identity();
      const url = `${target.functionsUrl}/${name}`;
      let response: Response;
      try {
        response = await doFetch(url, {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: `Bearer ${idToken}`, ...headers },
          body: JSON.stringify(body),
          signal: AbortSignal.timeout(60_000),
        });
      } catch (error) {
        throw new CliError(`Could not reach ${name} at ${url} (${connectionProblem(error)}). ${hint}`);
      }
      const text = await response.text();
      let parsed: unknown = text;
      try {
        parsed = text === '' ? null : JSON.parse(text);
      } catch {
        // Not JSON (a proxy's or the emulator's own page): kept as text.
      }
      if (response.ok) return { status: response.status, headers: response.headers, body: parsed };
      const refusal = parsed as { error?: unknown; message?: unknown } | null;
      if (typeof refusal === 'object' && refusal !== null && typeof refusal.message === 'string') {
        throw new RefusedError(response.status, typeof refusal.error === 'string' ? refusal.error : 'error', refusal.message, name);
      }
      const detail = text.trim().slice(0, 300) || response.statusText;
      if (response.status === 404) throw new CliError(`${name} is not at ${url} (404: ${detail}). ${hint}`);
      throw new CliError(`${name} answered ${response.status}: ${detail}`);
    },
  };
}
