/**
 * The web toolbox: `search` over a configured backend (SearXNG or Tavily) and `fetch_page`, a
 * guarded GET of a URL the model chose, reduced to readable text within a token budget; the full
 * text goes to an artifact. Each result carries, besides its JSON `content`, the `sources` a
 * citation needs (URL, title, passage, fetched-at).
 *
 * The JSON keeps the corpus toolbox's field names where they mean the same thing (`results` with
 * `id`, `title`, `snippet`, `score`; a page's `id`, `title`, `text`), with the URL as the id, so
 * code that reads corpus results reads these too.
 *
 * A malformed argument, a refused URL, a failing search or an unreadable page is an `ok: false`
 * result the model can read and act on; only the caller's abort (and a failing artifact store)
 * is thrown.
 */
import { createHash } from 'node:crypto';
import { z } from 'zod';
import type { ToolCall, ToolSpec } from '../provider';
import { toolArguments, toolError, toolParameters, type ToolResult, type Toolbox } from '../tools';
import type { Clock } from '../../core/clock';
import type { ArtifactSink } from './artifacts';
import type { FetchedPage, PageFetcher } from './page-fetcher';
import { cutToTokens, decodeBody, estimateTokens, readableFromHtml, readableFromText, type ReadablePage } from './readable';
import { SearchFailedError, type SearchBackend } from './search';

export const WEB_SEARCH_TOOL = 'search';
export const FETCH_PAGE_TOOL = 'fetch_page';

const DEFAULT_SEARCH_LIMIT = 5;
const MAX_SEARCH_LIMIT = 10;
const MAX_URL_CHARS = 2048;

export const webSearchArgumentsSchema = z.strictObject({
  query: z.string().trim().min(1).max(500).describe('What to search the web for.'),
  limit: z.int().min(1).max(MAX_SEARCH_LIMIT).optional().describe(`How many hits to return (default ${DEFAULT_SEARCH_LIMIT}).`),
});

export const fetchPageArgumentsSchema = z.strictObject({
  url: z.string().trim().min(1).max(MAX_URL_CHARS).describe('The http(s) URL of the page, for example one returned by search.'),
});

type Source = NonNullable<ToolResult['sources']>[number];

export interface WebToolboxOptions {
  readonly search: SearchBackend;
  readonly pages: PageFetcher;
  readonly artifacts: ArtifactSink;
  /** Stamps `fetchedAt` on every source. */
  readonly clock: Clock;
  /** Estimated tokens of page text handed to the model; the full text is kept as an artifact. */
  readonly pageTokenBudget: number;
}

function specsFor(backend: string, pageTokenBudget: number): readonly ToolSpec[] {
  return [
    {
      name: WEB_SEARCH_TOOL,
      description: `Search the web (${backend}). Returns URLs, titles and snippets, best first; use fetch_page to read a hit.`,
      parameters: toolParameters(webSearchArgumentsSchema),
    },
    {
      name: FETCH_PAGE_TOOL,
      description: `Fetch a public web page (HTML or text) and return its readable text, cut to about ${pageTokenBudget} tokens.`,
      parameters: toolParameters(fetchPageArgumentsSchema),
    },
  ];
}

function artifactName(url: string): string {
  return `page-${createHash('sha256').update(url).digest('hex').slice(0, 16)}.txt`;
}

class WebToolbox implements Toolbox {
  readonly specs: readonly ToolSpec[];

  constructor(private readonly options: WebToolboxOptions) {
    this.specs = specsFor(options.search.name, options.pageTokenBudget);
  }

  async execute(call: ToolCall, signal: AbortSignal): Promise<ToolResult> {
    signal.throwIfAborted();
    switch (call.name) {
      case WEB_SEARCH_TOOL: {
        const parsed = toolArguments(webSearchArgumentsSchema, call);
        return parsed.ok ? this.search(parsed.value.query, parsed.value.limit ?? DEFAULT_SEARCH_LIMIT, signal) : parsed.result;
      }
      case FETCH_PAGE_TOOL: {
        const parsed = toolArguments(fetchPageArgumentsSchema, call);
        return parsed.ok ? this.fetchPage(parsed.value.url, signal) : parsed.result;
      }
      default:
        return toolError(`Unknown tool "${call.name}". Available tools: ${WEB_SEARCH_TOOL}, ${FETCH_PAGE_TOOL}.`);
    }
  }

  private async search(query: string, limit: number, signal: AbortSignal): Promise<ToolResult> {
    const backend = this.options.search.name;
    let hits;
    try {
      hits = await this.options.search.search(query, limit, signal);
    } catch (error) {
      if (signal.aborted) throw signal.reason;
      if (error instanceof SearchFailedError) return toolError(error.message, { query, backend });
      throw error;
    }
    const fetchedAt = this.now();
    const results = hits.map((hit) => ({ id: hit.url, url: hit.url, title: hit.title, snippet: hit.snippet, score: hit.score }));
    const sources: Source[] = hits.map((hit) => ({ url: hit.url, title: hit.title, passage: hit.snippet, fetchedAt }));
    return { ok: true, content: JSON.stringify({ query, backend, results }), sources };
  }

  private async fetchPage(url: string, signal: AbortSignal): Promise<ToolResult> {
    const outcome = await this.options.pages.fetch(url, signal);
    if (!outcome.ok) return toolError(outcome.refusal.message, { url, reason: outcome.refusal.kind });
    const { page } = outcome;
    let readable: ReadablePage;
    try {
      const text = decodeBody(page.body, page.kind, page.charset);
      readable = page.kind === 'html' ? readableFromHtml(text) : readableFromText(text);
    } catch (error) {
      return toolError(`${page.url} could not be turned into text: ${error instanceof Error ? error.message : String(error)}`, { url, reason: 'unreadable' });
    }
    const fetchedAt = this.now();
    const artifact = await this.options.artifacts.put(artifactName(page.url), Buffer.from(readable.text, 'utf8'), 'text/plain; charset=utf-8');
    const shown = cutToTokens(readable.text, this.options.pageTokenBudget);
    const title = readable.title || page.url;
    const notes = notesFor(page, readable, shown.cut, this.options.pageTokenBudget, artifact.ref);
    const content = {
      id: page.url,
      url: page.url,
      ...(page.url === page.requestedUrl ? {} : { requestedUrl: page.requestedUrl }),
      title,
      contentType: page.mediaType,
      fetchedAt,
      text: shown.text,
      truncated: { bytes: page.truncated, tokens: shown.cut },
      ...(notes.length > 0 ? { notes } : {}),
      artifact,
    };
    return { ok: true, content: JSON.stringify(content), sources: [{ url: page.url, title, passage: readable.excerpt, fetchedAt, artifact }] };
  }

  private now(): string {
    return new Date(this.options.clock.now()).toISOString();
  }
}

function notesFor(page: FetchedPage, readable: ReadablePage, tokensCut: boolean, tokenBudget: number, artifactRef: string): string[] {
  const notes: string[] = [];
  if (page.truncated) notes.push(`The page is larger than ${page.body.length} bytes; only its first ${page.body.length} bytes were read.`);
  if (tokensCut) notes.push(`The text was cut to about ${tokenBudget} of its ${estimateTokens(readable.text)} estimated tokens; the full text is kept as artifact ${artifactRef}.`);
  if (readable.text === '') notes.push('The page has no readable text.');
  return notes;
}

export function createWebToolbox(options: WebToolboxOptions): Toolbox {
  return new WebToolbox(options);
}
