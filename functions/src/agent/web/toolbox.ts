/**
 * The web toolbox: `search` over a configured backend (SearXNG or Tavily) and `fetch_page`, a
 * guarded GET of a URL the model chose, reduced to readable text within a token budget; the full
 * text is kept durably as an artifact of the job (store/artifact-store.ts), and the result says so,
 * with its size, so a cut is never silent. Each result carries, besides its JSON `content`, the
 * `sources` a citation needs (URL, title, passage, fetched-at).
 *
 * Artifacts belong to a job, so fetch_page runs on a toolbox bound to one (`forJob`); the research
 * pipeline binds it for each section it runs.
 *
 * The JSON keeps the corpus toolbox's field names where they mean the same thing (`results` with
 * `id`, `title`, `snippet`, `score`; a page's `id`, `title`, `text`), with the URL as the id, so
 * code that reads corpus results reads these too.
 *
 * A malformed argument, a refused URL, a failing search or an unreadable page is an `ok: false`
 * result the model can read and act on; only the caller's abort (and a failing artifact store)
 * is thrown.
 */
import { z } from 'zod';
import type { ToolCall, ToolSpec } from '../provider';
import { toolArguments, toolError, toolParameters, type ToolResult, type Toolbox } from '../tools';
import type { Clock } from '../../core/clock';
import { ArtifactBudgetError, type ArtifactRef, type ArtifactStore } from '../../store/artifact-store';
import type { FetchedPage, PageFetcher } from './page-fetcher';
import { cutToTokens, decodeBody, estimateTokens, type ReadablePage } from './text-budget';
import { defaultReadableExtractor, type ExtractionOutcome, type ReadableExtractor } from './readable-extractor';
import { SearchFailedError, type SearchBackend } from './search';

export const WEB_SEARCH_TOOL = 'search';
export const FETCH_PAGE_TOOL = 'fetch_page';

const DEFAULT_SEARCH_LIMIT = 5;
const MAX_SEARCH_LIMIT = 10;
const MAX_URL_CHARS = 2048;
/** A web page or search hit names its own title, of any length: cut it, since it travels in every save of the thread. */
const MAX_SOURCE_TITLE_CHARS = 300;
const sourceTitle = (title: string): string => (title.length > MAX_SOURCE_TITLE_CHARS ? `${title.slice(0, MAX_SOURCE_TITLE_CHARS - 1)}…` : title);

export const webSearchArgumentsSchema = z.strictObject({
  query: z.string().trim().min(1).max(500).describe('What to search the web for.'),
  limit: z.int().min(1).max(MAX_SEARCH_LIMIT).optional().describe(`How many hits to return (default ${DEFAULT_SEARCH_LIMIT}).`),
});

export const fetchPageArgumentsSchema = z.strictObject({
  url: z.string().trim().min(1).max(MAX_URL_CHARS).describe('The http(s) URL of the page, for example one returned by search.'),
});

type Source = NonNullable<ToolResult['sources']>[number];

/** What the web toolbox needs: a search backend, a page fetcher, an artifact store, a clock and its budgets. */
export interface WebToolboxOptions {
  readonly search: SearchBackend;
  readonly pages: PageFetcher;
  readonly artifacts: ArtifactStore;
  /** The job whose artifacts fetch_page writes; set by `forJob`. */
  readonly jobId?: string;
  /** Stamps `fetchedAt` on every source. */
  readonly clock: Clock;
  /** Estimated tokens of page text handed to the model; the full text is kept as an artifact. */
  readonly pageTokenBudget: number;
  /** Makes a page's readable text off the step's thread, within limits; the process's shared one by default. */
  readonly extractor?: ReadableExtractor;
  /**
   * Bytes of artifacts the job may hold when fetch_page keeps another page's text; a page past it
   * is a tool error, not kept. Unbounded when unset.
   */
  readonly artifactBytesPerJob?: number;
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

/** A web toolbox, and the same toolbox bound to the job whose artifacts fetch_page writes. */
export interface WebToolbox extends Toolbox {
  forJob(jobId: string): WebToolbox;
}

const PAGE_TEXT_TYPE = 'text/plain; charset=utf-8';

/** How a result names an artifact: the store finds it under the job by this hash. */
export function artifactLabel(ref: Pick<ArtifactRef, 'sha256'>): string {
  return `sha256:${ref.sha256}`;
}

class JobWebToolbox implements WebToolbox {
  readonly specs: readonly ToolSpec[];

  constructor(private readonly options: WebToolboxOptions) {
    this.specs = specsFor(options.search.name, options.pageTokenBudget);
  }

  forJob(jobId: string): WebToolbox {
    return new JobWebToolbox({ ...this.options, jobId });
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
    const results = hits.map((hit) => ({ id: hit.url, url: hit.url, title: sourceTitle(hit.title), snippet: hit.snippet, score: hit.score }));
    const sources: Source[] = hits.map((hit) => ({ url: hit.url, title: sourceTitle(hit.title), passage: hit.snippet, fetchedAt }));
    return { ok: true, content: JSON.stringify({ query, backend, results }), sources };
  }

  private async fetchPage(url: string, signal: AbortSignal): Promise<ToolResult> {
    const outcome = await this.options.pages.fetch(url, signal);
    if (!outcome.ok) return toolError(outcome.refusal.message, { url, reason: outcome.refusal.kind });
    const { page } = outcome;
    const extractor = this.options.extractor ?? defaultReadableExtractor();
    const extracted: ExtractionOutcome = await extractor.extract(decodeBody(page.body, page.kind, page.charset), page.kind, signal);
    if (!extracted.ok) {
      const message = extracted.reason === 'too_complex' ? `${page.url}: ${extracted.message}` : `${page.url} could not be turned into text: ${extracted.message}`;
      return toolError(message, { url, reason: extracted.reason });
    }
    const readable: ReadablePage = extracted.page;
    const fetchedAt = this.now();
    const { jobId } = this.options;
    // A programming error, not the model's: the pipeline binds the toolbox to the job it runs.
    if (jobId === undefined) throw new Error('fetch_page keeps full texts under a job: call it on a toolbox bound with forJob(jobId)');
    let ref: ArtifactRef;
    try {
      const maxJobBytes = this.options.artifactBytesPerJob;
      ({ ref } = await this.options.artifacts.put(jobId, readable.text, { contentType: PAGE_TEXT_TYPE, ...(maxJobBytes === undefined ? {} : { maxJobBytes }) }));
    } catch (error) {
      if (!(error instanceof ArtifactBudgetError)) throw error;
      return toolError(
        `${page.url} was read but not kept: this job may keep ${error.maxJobBytes} bytes of page text and other artifacts and holds ${error.storedBytes}; this page's ${error.size} bytes would pass that. Answer from the pages already read.`,
        { url, reason: 'artifact_budget' },
      );
    }
    const artifact = { ref: artifactLabel(ref), sha256: ref.sha256, size: ref.size };
    const shown = cutToTokens(readable.text, this.options.pageTokenBudget);
    const title = sourceTitle(readable.title || page.url);
    const notes = notesFor(page, readable, shown.cut, this.options.pageTokenBudget, artifact);
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

function notesFor(page: FetchedPage, readable: ReadablePage, tokensCut: boolean, tokenBudget: number, artifact: { ref: string; size: number }): string[] {
  const notes: string[] = [];
  if (page.truncated) notes.push(`The page is larger than ${page.body.length} bytes; only its first ${page.body.length} bytes were read.`);
  if (tokensCut) {
    notes.push(`The text was cut to about ${tokenBudget} of its ${estimateTokens(readable.text)} estimated tokens; the full text (${artifact.size} bytes) is kept as artifact ${artifact.ref}.`);
  }
  if (readable.text === '') notes.push('The page has no readable text.');
  return notes;
}

/** The web research toolbox: `search` through a search backend and `fetch_page`, whose full text is kept as an artifact under the job. */
export function createWebToolbox(options: WebToolboxOptions): WebToolbox {
  return new JobWebToolbox(options);
}
