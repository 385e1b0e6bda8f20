/**
 * The corpus toolbox: `search` and `read` over the bundled documents. Deterministic (term scoring
 * with fixed tie-breaks), never throws for bad input (the model sees an `ok: false` result and
 * may try again), and counts every execution so tests can prove a call was not repeated.
 *
 * Tool results are JSON text: `{"query","results":[{"id","title","snippet","score"}]}` for a
 * search, `{"id","title","text"}` for a read, `{"error"}` for a failure. The offline agent parses
 * them back; a real model reads them as they are. Each hit and each document read is also a
 * source (its corpus URL, title, the snippet or opening shown, when it was read), for citations.
 */
import { z } from 'zod';
import type { ToolCall, ToolSpec } from '../../agent/provider';
import { toolArguments, toolError, toolParameters, type ToolResult, type Toolbox } from '../../agent/tools';
import { systemClock, type Clock } from '../../core/clock';
import { RetryableError } from '../../core/errors';
import { currentStep } from '../../telemetry/scope';
import { CORPUS, corpusDocumentUrl, type CorpusDocument } from './corpus';
import { appendToolExecution } from './execution-log';
import { parseOfflineSettings, type OfflineSettingsInput } from './settings';
import { contentTerms, distinctTerms, splitParagraphs, splitSentences, unitInterval } from './text';

export const SEARCH_TOOL = 'search';
export const READ_TOOL = 'read';

export const DEFAULT_SEARCH_LIMIT = 5;
export const MAX_SEARCH_LIMIT = 10;
const SNIPPET_CHARS = 220;
/** The opening of a document read that its source records as the passage shown. */
const READ_PASSAGE_CHARS = 400;

export const searchArgumentsSchema = z.strictObject({
  query: z.string().trim().min(1).max(500).describe('Words to look for in document titles and text.'),
  limit: z.int().min(1).max(MAX_SEARCH_LIMIT).optional().describe(`How many hits to return (default ${DEFAULT_SEARCH_LIMIT}).`),
});

export const readArgumentsSchema = z.strictObject({
  id: z.string().trim().min(1).max(200).describe('A document id returned by search.'),
});

export const searchHitSchema = z.object({ id: z.string(), title: z.string(), snippet: z.string(), score: z.number() });
export const searchResultSchema = z.object({ query: z.string(), results: z.array(searchHitSchema) });
export const readResultSchema = z.object({ id: z.string(), title: z.string(), text: z.string() });

export type SearchHit = z.infer<typeof searchHitSchema>;

/**
 * A tool result that was only partly delivered: the calls before it in the same group returned,
 * this one did not. Retryable; the engine records what did arrive and runs this call again.
 */
export class ToolInterruptedError extends RetryableError {
  readonly callId: string;
  readonly toolName: string;

  constructor(callId: string, toolName: string) {
    super(`Tool result for ${toolName} call ${callId} was interrupted before it was delivered (simulated partial result set)`);
    this.callId = callId;
    this.toolName = toolName;
  }
}

/**
 * Call IDs the offline agent gives the calls of one assistant message: `call_<10 hex>_<position>`.
 * The position lets the toolbox simulate a group whose later results were lost; calls with IDs
 * of any other shape (from a real provider) are never interrupted.
 */
export function groupCallId(groupDigest: string, position: number): string {
  return `call_${groupDigest.slice(0, 10)}_${position}`;
}

export function groupPosition(callId: string): number | undefined {
  const match = /^call_[0-9a-f]{10}_(\d{1,3})$/.exec(callId);
  return match?.[1] === undefined ? undefined : Number(match[1]);
}

export interface CorpusToolboxStats {
  /** Every call to `execute`, whatever its outcome (interrupted and invalid calls included). */
  readonly total: number;
  readonly byTool: Readonly<Record<string, number>>;
  readonly byCallId: Readonly<Record<string, number>>;
  /** Executions that handed a result back, by call ID (interrupted ones are not among them). */
  readonly deliveredByCallId: Readonly<Record<string, number>>;
}

export interface CorpusToolbox extends Toolbox {
  readonly documents: readonly CorpusDocument[];
  /** A snapshot of the execution counts. */
  stats(): CorpusToolboxStats;
  /** How many times a call ID was executed (0 if never). */
  executionsOf(callId: string): number;
}

export interface CorpusToolboxOptions {
  readonly settings?: OfflineSettingsInput;
  readonly seed?: number;
  /** Another corpus (tests); defaults to the bundled one. */
  readonly documents?: readonly CorpusDocument[];
  /** Stamps `fetchedAt` on sources; the system clock by default. */
  readonly clock?: Clock;
}

interface IndexedDocument {
  readonly document: CorpusDocument;
  readonly titleTerms: ReadonlySet<string>;
  readonly textCounts: ReadonlyMap<string, number>;
  readonly sentences: readonly string[];
}

export const CORPUS_TOOL_SPECS: readonly ToolSpec[] = [
  {
    name: SEARCH_TOOL,
    description: 'Search the bundled corpus of notes on durable computing. Returns document ids, titles and snippets, best first.',
    parameters: toolParameters(searchArgumentsSchema),
  },
  {
    name: READ_TOOL,
    description: 'Read the full text of one corpus document by its id.',
    parameters: toolParameters(readArgumentsSchema),
  },
];

function truncate(text: string, maxChars: number): string {
  if (text.length <= maxChars) return text;
  const cut = text.slice(0, maxChars);
  const lastSpace = cut.lastIndexOf(' ');
  return `${(lastSpace > maxChars / 2 ? cut.slice(0, lastSpace) : cut).trimEnd()}…`;
}

class CorpusIndex {
  private readonly indexed: readonly IndexedDocument[];
  private readonly idf = new Map<string, number>();

  constructor(documents: readonly CorpusDocument[]) {
    this.indexed = documents.map((document) => {
      const textCounts = new Map<string, number>();
      for (const term of contentTerms(document.text)) textCounts.set(term, (textCounts.get(term) ?? 0) + 1);
      return {
        document,
        titleTerms: new Set(contentTerms(document.title)),
        textCounts,
        sentences: splitParagraphs(document.text).flatMap(splitSentences),
      };
    });
    const documentFrequency = new Map<string, number>();
    for (const entry of this.indexed) {
      for (const term of new Set([...entry.titleTerms, ...entry.textCounts.keys()])) {
        documentFrequency.set(term, (documentFrequency.get(term) ?? 0) + 1);
      }
    }
    for (const [term, frequency] of documentFrequency) this.idf.set(term, Math.log(1 + documents.length / frequency));
  }

  search(query: string, limit: number): SearchHit[] {
    const terms = distinctTerms(query).filter((term) => this.idf.has(term));
    const hits: SearchHit[] = [];
    for (const entry of this.indexed) {
      let score = 0;
      for (const term of terms) {
        const idf = this.idf.get(term) ?? 0;
        if (entry.titleTerms.has(term)) score += 2 * idf;
        const count = entry.textCounts.get(term) ?? 0;
        if (count > 0) score += idf * (1 + Math.log(count));
      }
      if (score > 0) {
        hits.push({ id: entry.document.id, title: entry.document.title, snippet: this.snippet(entry, terms), score: Math.round(score * 1000) / 1000 });
      }
    }
    hits.sort((left, right) => right.score - left.score || (left.id < right.id ? -1 : left.id > right.id ? 1 : 0));
    return hits.slice(0, limit);
  }

  find(id: string): CorpusDocument | undefined {
    return this.indexed.find((entry) => entry.document.id === id)?.document;
  }

  private snippet(entry: IndexedDocument, terms: readonly string[]): string {
    let best = entry.sentences[0] ?? '';
    let bestHits = -1;
    for (const sentence of entry.sentences) {
      const sentenceTerms = new Set(contentTerms(sentence));
      const hits = terms.filter((term) => sentenceTerms.has(term)).length;
      if (hits > bestHits) {
        best = sentence;
        bestHits = hits;
      }
    }
    return truncate(best, SNIPPET_CHARS);
  }
}

class CorpusToolboxImpl implements CorpusToolbox {
  readonly specs = CORPUS_TOOL_SPECS;
  private readonly index: CorpusIndex;
  private readonly byTool = new Map<string, number>();
  private readonly byCallId = new Map<string, number>();
  private readonly deliveredByCallId = new Map<string, number>();
  private total = 0;

  constructor(
    readonly documents: readonly CorpusDocument[],
    private readonly partialRate: number,
    private readonly seed: number,
    /** Test instrumentation (execution-log.ts); undefined: nothing is written. */
    private readonly executionLog: string | undefined,
    private readonly clock: Clock,
  ) {
    this.index = new CorpusIndex(documents);
  }

  /** Its tools search a bundled corpus: no call has an external effect, so any may run again after a crash. */
  repeatable(_toolName?: string): boolean {
    return true;
  }

  execute(call: ToolCall, signal: AbortSignal): Promise<ToolResult> {
    return Promise.resolve().then(() => this.run(call, signal));
  }

  stats(): CorpusToolboxStats {
    return {
      total: this.total,
      byTool: Object.fromEntries(this.byTool),
      byCallId: Object.fromEntries(this.byCallId),
      deliveredByCallId: Object.fromEntries(this.deliveredByCallId),
    };
  }

  executionsOf(callId: string): number {
    return this.byCallId.get(callId) ?? 0;
  }

  private run(call: ToolCall, signal: AbortSignal): ToolResult {
    signal.throwIfAborted();
    const startedAtMs = Date.now();
    const earlierExecutions = this.executionsOf(call.id);
    this.total += 1;
    this.byTool.set(call.name, (this.byTool.get(call.name) ?? 0) + 1);
    this.byCallId.set(call.id, earlierExecutions + 1);

    const position = groupPosition(call.id);
    if (position !== undefined && position >= 1 && this.partialRate > 0) {
      if (unitInterval(this.seed, 'partial-tool-result', call.id, earlierExecutions) < this.partialRate) {
        this.logExecution(call, startedAtMs, false);
        throw new ToolInterruptedError(call.id, call.name);
      }
    }
    this.logExecution(call, startedAtMs, true);
    this.deliveredByCallId.set(call.id, (this.deliveredByCallId.get(call.id) ?? 0) + 1);

    switch (call.name) {
      case SEARCH_TOOL: {
        const parsed = toolArguments(searchArgumentsSchema, call);
        if (!parsed.ok) return parsed.result;
        const results = this.index.search(parsed.value.query, parsed.value.limit ?? DEFAULT_SEARCH_LIMIT);
        const fetchedAt = this.fetchedAt();
        const sources = results.map((hit) => ({ url: corpusDocumentUrl(hit.id), title: hit.title, passage: hit.snippet, fetchedAt }));
        return { ok: true, content: JSON.stringify({ query: parsed.value.query, results }), sources };
      }
      case READ_TOOL: {
        const parsed = toolArguments(readArgumentsSchema, call);
        if (!parsed.ok) return parsed.result;
        const document = this.index.find(parsed.value.id);
        if (document === undefined) return toolError(`No document with id "${parsed.value.id}". Use search to find document ids.`);
        const passage = truncate(splitParagraphs(document.text)[0] ?? '', READ_PASSAGE_CHARS);
        const source = { url: corpusDocumentUrl(document.id), title: document.title, passage, fetchedAt: this.fetchedAt() };
        return { ok: true, content: JSON.stringify({ id: document.id, title: document.title, text: document.text }), sources: [source] };
      }
      default:
        return toolError(`Unknown tool "${call.name}". Available tools: ${SEARCH_TOOL}, ${READ_TOOL}.`);
    }
  }

  private fetchedAt(): string {
    return new Date(this.clock.now()).toISOString();
  }

  private logExecution(call: ToolCall, startedAtMs: number, delivered: boolean): void {
    if (this.executionLog === undefined) return;
    const step = currentStep()?.fields;
    const claim = step?.epoch === undefined ? {} : { claim: { unit: step.unit ?? null, epoch: step.epoch } };
    appendToolExecution(this.executionLog, { callId: call.id, tool: call.name, startedAtMs, delivered, pid: process.pid, repeatable: this.repeatable(call.name), ...claim });
  }
}

/** The toolbox over the bundled corpus (or `documents`), with partial-result faults from `settings`. */
export function createCorpusToolbox(options: CorpusToolboxOptions = {}): CorpusToolbox {
  const settings = parseOfflineSettings(options.settings ?? {});
  return new CorpusToolboxImpl(options.documents ?? CORPUS, settings.partialToolResultsRate, options.seed ?? 0, settings.toolExecutionLog, options.clock ?? systemClock);
}
