/**
 * Web search backends behind one small port: a self-hosted SearXNG instance (its JSON API) and
 * Tavily (hosted, through its official client). A backend answers hits or throws
 * SearchFailedError with a message the model can read; only the caller's abort passes through
 * as itself.
 */
import { createRequire } from 'node:module';
import type { TavilyClient } from '@tavily/core';
import { z } from 'zod';

const loadPackage = createRequire(__filename);

export interface WebSearchHit {
  readonly url: string;
  readonly title: string;
  /** The passage the engine showed for the hit. */
  readonly snippet: string;
  /** Higher is better; the backend's own score, or one from the rank when it gives none. */
  readonly score: number;
}

/** A web search service the search tool queries: hits (title, URL, snippet) or SearchFailedError. */
export interface SearchBackend {
  /** For people and tool results: `searxng` or `tavily`. */
  readonly name: string;
  search(query: string, limit: number, signal: AbortSignal): Promise<WebSearchHit[]>;
}

/** The search did not answer usable hits; the message says why, without secrets. */
export class SearchFailedError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'SearchFailedError';
  }
}

const SNIPPET_CHARS = 500;

function isWebUrl(text: string): boolean {
  try {
    const { protocol } = new URL(text);
    return protocol === 'http:' || protocol === 'https:';
  } catch {
    return false;
  }
}

interface RawHit {
  readonly url: string;
  readonly title: string | null | undefined;
  readonly snippet: string | null | undefined;
  readonly score: number | null | undefined;
}

/** Web URLs only, each once, at most `limit`, with the text tidied. */
function cleanHits(hits: readonly RawHit[], limit: number): WebSearchHit[] {
  const seen = new Set<string>();
  const cleaned: WebSearchHit[] = [];
  for (const [rank, hit] of hits.entries()) {
    if (!isWebUrl(hit.url) || seen.has(hit.url)) continue;
    seen.add(hit.url);
    const snippet = (hit.snippet ?? '').replace(/\s+/g, ' ').trim();
    cleaned.push({
      url: hit.url,
      title: (hit.title ?? '').replace(/\s+/g, ' ').trim() || hit.url,
      snippet: snippet.length > SNIPPET_CHARS ? `${snippet.slice(0, SNIPPET_CHARS)}…` : snippet,
      score: typeof hit.score === 'number' && Number.isFinite(hit.score) ? Math.round(hit.score * 1000) / 1000 : Math.round(1000 / (rank + 1)) / 1000,
    });
    if (cleaned.length >= limit) break;
  }
  return cleaned;
}

function withTimeout(signal: AbortSignal, timeoutMs: number): { signal: AbortSignal; timedOut: () => boolean } {
  const deadline = AbortSignal.timeout(timeoutMs);
  return { signal: AbortSignal.any([signal, deadline]), timedOut: () => deadline.aborted };
}

/** Settings of a SearXNG search backend: its base URL and limits. */
export interface SearxngOptions {
  /** The instance's base URL, e.g. `http://searxng:8080/`; `search` is resolved against it. */
  readonly baseUrl: string;
  readonly timeoutMs: number;
}

const searxngResponseSchema = z.object({
  results: z.array(
    z.object({
      url: z.string(),
      title: z.string().nullish(),
      content: z.string().nullish(),
      score: z.number().nullish(),
    }),
  ),
});

/**
 * SearXNG's `GET /search?q=…&format=json`. The instance must list `json` under `search.formats`
 * in its settings.yml; it answers 403 otherwise, and the error says so. It takes no result count,
 * so the first page is cut to the limit here.
 */
export function createSearxngBackend(options: SearxngOptions): SearchBackend {
  const base = options.baseUrl.endsWith('/') ? options.baseUrl : `${options.baseUrl}/`;
  return {
    name: 'searxng',
    async search(query, limit, signal) {
      const url = new URL('search', base);
      url.searchParams.set('q', query);
      url.searchParams.set('format', 'json');
      const deadline = withTimeout(signal, options.timeoutMs);
      let body: unknown;
      try {
        const response = await fetch(url, { headers: { accept: 'application/json' }, signal: deadline.signal });
        if (response.status === 403) {
          throw new SearchFailedError('The SearXNG instance refused the JSON format (HTTP 403): its settings.yml must list json under search.formats.');
        }
        if (!response.ok) throw new SearchFailedError(`The SearXNG instance answered HTTP ${response.status}.`);
        body = await response.json();
      } catch (error) {
        if (signal.aborted) throw signal.reason;
        if (error instanceof SearchFailedError) throw error;
        if (deadline.timedOut()) throw new SearchFailedError(`The SearXNG instance did not answer within ${options.timeoutMs} ms.`, { cause: error });
        throw new SearchFailedError(`The SearXNG instance could not be reached or sent no JSON: ${error instanceof Error ? error.message : String(error)}.`, { cause: error });
      }
      const parsed = searxngResponseSchema.safeParse(body);
      if (!parsed.success) throw new SearchFailedError('The SearXNG instance answered JSON without a results list.');
      return cleanHits(
        parsed.data.results.map((result) => ({ url: result.url, title: result.title, snippet: result.content, score: result.score })),
        limit,
      );
    },
  };
}

/** Settings of the Tavily search backend: its API key, endpoint and limits. */
export interface TavilyOptions {
  readonly apiKey: string;
  /** `https://api.tavily.com` in production; a local server in tests (the client's `apiBaseURL`). */
  readonly baseUrl: string;
  readonly timeoutMs: number;
}

/**
 * Tavily through `@tavily/core`, which takes the key and a base URL. The client takes no abort
 * signal, only a timeout in whole seconds: the caller's abort is honoured by no longer waiting
 * (a search has no side effect to leave half done), and the timeout is rounded up.
 */
export function createTavilyBackend(options: TavilyOptions): SearchBackend {
  // Loaded at the first search, not at cold start: a step that searches nothing does not pay for the client. Required,
  // not imported: the package's CommonJS build (the one the tests run), synchronously, so a search aborted meanwhile
  // never goes out and a package that fails to load fails the step as itself, not as a search error the model reads.
  let client: TavilyClient | undefined;
  const connected = (): TavilyClient => {
    if (client === undefined) {
      const { tavily } = loadPackage('@tavily/core') as typeof import('@tavily/core');
      client = tavily({ apiKey: options.apiKey, apiBaseURL: options.baseUrl.replace(/\/+$/, ''), clientSource: 'phaseline' });
    }
    return client;
  };
  const redact = (text: string): string => text.split(options.apiKey).join('[redacted]');
  return {
    name: 'tavily',
    async search(query, limit, signal) {
      signal.throwIfAborted();
      const tavily = connected();
      let aborted: (() => void) | undefined;
      const abort = new Promise<never>((_resolve, reject) => {
        aborted = () => reject(signal.reason as Error);
        signal.addEventListener('abort', aborted, { once: true });
      });
      try {
        const answer = await Promise.race([
          tavily.search(query, { maxResults: limit, searchDepth: 'basic', includeAnswer: false, includeRawContent: false, timeout: Math.ceil(options.timeoutMs / 1000) }),
          abort,
        ]);
        return cleanHits(
          answer.results.map((result) => ({ url: result.url, title: result.title, snippet: result.content, score: result.score })),
          limit,
        );
      } catch (error) {
        if (signal.aborted) throw signal.reason;
        // No cause attached: the client's errors carry its request config, Authorization header included.
        throw new SearchFailedError(`Tavily search failed: ${redact(error instanceof Error ? error.message : String(error))}`);
      } finally {
        if (aborted !== undefined) signal.removeEventListener('abort', aborted);
        // The race's loser must not surface as an unhandled rejection later.
        abort.catch(() => undefined);
      }
    },
  };
}
