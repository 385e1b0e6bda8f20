/**
 * The scripted research agent behind the offline provider. Not a language model: it searches with
 * keywords from the section prompt, reads the best hits, and answers with sentences copied from
 * what it read, citing each source as a model is asked to: by the number the citation key under
 * the result gives it (`[n]`). Like a model, it sees only message text; a transcript without keys
 * gets the sources named in a closing "Sources:" line instead.
 *
 * It uses the tools it is offered: with the corpus tools it reads documents with `read`; with the
 * web tools (`search` and `fetch_page`, no `read`) it fetches the hits' URLs with `fetch_page`, so
 * offline runs against a local search server exercise the same path a real model takes.
 *
 * `nextAgentTurn` is a pure function of (seed, transcript, offered tools). It derives its state
 * from the transcript alone (which planned searches were answered, which documents were read),
 * so it continues correctly from any sound transcript, in any process: after a crash whose
 * transcript ends with tool results it goes on from there and never repeats an answered search.
 */
import { z } from 'zod';
import type { ChatMessage, ToolCall, ToolSpec } from '../../agent/provider';
import { ProviderRequestError } from '../../agent/provider';
import { splitCitationKey, urlForText } from '../../agent/transcript';
import { FETCH_PAGE_TOOL } from '../../agent/web/toolbox';
import { corpusDocumentUrl } from './corpus';
import { READ_TOOL, SEARCH_TOOL, groupCallId, readResultSchema, searchResultSchema } from './toolbox';
import { countWords, digest, distinctTerms, splitParagraphs, splitSentences, unitInterval } from './text';

/** The honest one-line note every final answer starts with. */
export const OFFLINE_NOTE = 'Offline simulator: extractive notes from the bundled corpus, not a language model.';
/** The same note when the sources were web pages fetched with `fetch_page`. */
export const OFFLINE_WEB_NOTE = 'Offline simulator: extractive notes from the web pages it fetched, not a language model.';

/** How the agent reads what search found, and how it says so: one per toolbox it can work with. */
interface Reader {
  readonly tool: string;
  readonly note: string;
  /** What it searches, as it says so ("searching the web for ..."). */
  readonly searched: string;
  /** How it says it reads hits ("fetching a, b"), and the argument of the call that reads one (a corpus document id, or a page URL). */
  readonly verb: string;
  readonly argument: 'id' | 'url';
  readonly nothingFound: string;
  /** Only whole sentences of some length: the text of a web page also has headings, captions and menus. */
  readonly wholeSentencesOnly: boolean;
  /** The document a reading call's result holds (null: not one), and the URL its citation key names it by. */
  documentOf(result: unknown): ReadDocument | null;
  citationUrl(id: string): string;
}

const CORPUS_READER: Reader = {
  tool: READ_TOOL,
  note: OFFLINE_NOTE,
  searched: 'the bundled corpus',
  verb: 'reading',
  argument: 'id',
  nothingFound: 'The bundled corpus has no document that matches this prompt, so there is nothing to report from it.',
  wholeSentencesOnly: false,
  documentOf: (result) => readResultSchema.safeParse(result).data ?? null,
  citationUrl: corpusDocumentUrl,
};

const WEB_READER: Reader = {
  tool: FETCH_PAGE_TOOL,
  note: OFFLINE_WEB_NOTE,
  searched: 'the web',
  verb: 'fetching',
  argument: 'url',
  nothingFound: 'No page it could fetch matches this prompt, so there is nothing to report from the web.',
  wholeSentencesOnly: true,
  documentOf: (result) => {
    const page = fetchedPageSchema.safeParse(result);
    return page.success ? { id: page.data.url, title: page.data.title, text: page.data.text } : null;
  },
  citationUrl: urlForText,
};

/** What a fetch_page result shows, as far as the agent reads it (web/toolbox.ts writes more). */
const fetchedPageSchema = z.object({ url: z.string(), title: z.string(), text: z.string() });
/** A sentence a page's text offers that reads as one: ends like a sentence, five words or more. */
const WHOLE_SENTENCE = /[.!?]["')\]]?$/;
const MIN_SENTENCE_WORDS = 5;

export const DEFAULT_TARGET_WORDS = 150;
/** Assistant turns after the prompt beyond which the agent answers with what it has. */
export const MAX_AGENT_TURNS = 8;

export interface AgentTurn {
  readonly content: string | null;
  /** Empty for a final answer. */
  readonly toolCalls: readonly ToolCall[];
}

interface Plan {
  readonly prompt: string;
  readonly queries: readonly string[];
  readonly groupSearches: boolean;
  readonly groupReads: boolean;
  readonly readCount: number;
  readonly targetWords: number;
  readonly terms: readonly string[];
}

interface ReadDocument {
  readonly id: string;
  readonly title: string;
  readonly text: string;
  /** The number its result's citation key gave it, if the result had one. */
  readonly citation?: number;
}

interface Progress {
  readonly searchCalls: number;
  readonly searchedQueries: ReadonlySet<string>;
  readonly ranking: readonly string[];
  readonly attemptedReads: ReadonlySet<string>;
  readonly reads: readonly ReadDocument[];
  readonly assistantTurns: number;
}

/** A `words` hint such as "about 150 words" or "200-word"; clamped to a sane range. */
export function targetWordsOf(prompt: string): number {
  const match = /\b(\d{2,4})\s*-?\s*words?\b/i.exec(prompt);
  if (match?.[1] === undefined) return DEFAULT_TARGET_WORDS;
  return Math.min(1_500, Math.max(30, Number(match[1])));
}

/**
 * Rejects what a real Chat Completions API rejects: a tool message that answers no call of the
 * assistant message just before it, and an assistant message whose calls are not all answered
 * before the next message of another kind.
 */
export function assertSoundTranscript(messages: readonly ChatMessage[]): void {
  for (let index = 0; index < messages.length; index += 1) {
    const message = messages[index];
    if (message === undefined) continue;
    if (message.role === 'tool') {
      throw new ProviderRequestError(`Transcript message ${index} is a tool result (${message.toolCallId}) that follows no matching tool call`);
    }
    if (message.role !== 'assistant' || message.toolCalls === undefined || message.toolCalls.length === 0) continue;
    const open = new Set<string>();
    for (const call of message.toolCalls) {
      if (open.has(call.id)) throw new ProviderRequestError(`Transcript message ${index} repeats tool call ID ${call.id}`);
      open.add(call.id);
    }
    let next = index + 1;
    for (let reply = messages[next]; reply?.role === 'tool'; reply = messages[next]) {
      if (!open.delete(reply.toolCallId)) {
        throw new ProviderRequestError(`Transcript message ${next} answers tool call ${reply.toolCallId}, which is not open at that point`);
      }
      next += 1;
    }
    if (open.size > 0) {
      throw new ProviderRequestError(`Transcript has unresolved tool calls after message ${index}: ${[...open].join(', ')}`);
    }
    index = next - 1;
  }
}

function lastPromptIndex(messages: readonly ChatMessage[]): number {
  for (let index = messages.length - 1; index >= 0; index -= 1) {
    if (messages[index]?.role === 'user') return index;
  }
  return -1;
}

function normalizeQuery(query: string): string {
  return query.toLowerCase().replace(/\s+/g, ' ').trim();
}

function planFor(seed: number, prompt: string): Plan {
  const terms = distinctTerms(prompt);
  const queries: string[] = [];
  if (terms.length > 0) {
    queries.push(terms.slice(0, 4).join(' '));
    if (terms.length > 4) queries.push(terms.slice(4, 8).join(' '));
  } else if (prompt.trim() !== '') {
    queries.push(prompt.trim().slice(0, 200));
  }
  const targetWords = targetWordsOf(prompt);
  const baseReads = targetWords <= 120 ? 2 : targetWords <= 250 ? 3 : 4;
  return {
    prompt,
    queries,
    groupSearches: unitInterval(seed, 'group-searches', prompt) < 0.6,
    groupReads: unitInterval(seed, 'group-reads', prompt) < 0.5,
    readCount: Math.min(4, baseReads + (unitInterval(seed, 'extra-read', prompt) < 0.25 ? 1 : 0)),
    targetWords,
    terms,
  };
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

function stringArgument(call: ToolCall | undefined, key: string): string | undefined {
  if (call === undefined) return undefined;
  const value: unknown = parseJson(call.arguments);
  if (typeof value !== 'object' || value === null) return undefined;
  const field: unknown = (value as Record<string, unknown>)[key];
  return typeof field === 'string' ? field : undefined;
}

/** What the transcript after the prompt shows was already done. */
function progressOf(after: readonly ChatMessage[]): Progress {
  const calls = new Map<string, ToolCall>();
  const searchedQueries = new Set<string>();
  const attemptedReads = new Set<string>();
  const reads: ReadDocument[] = [];
  const scores = new Map<string, number>();
  let searchCalls = 0;
  let assistantTurns = 0;
  for (const message of after) {
    if (message.role === 'assistant') {
      assistantTurns += 1;
      for (const call of message.toolCalls ?? []) calls.set(call.id, call);
      continue;
    }
    if (message.role !== 'tool') continue;
    const call = calls.get(message.toolCallId);
    const name = call?.name ?? message.name;
    if (name === SEARCH_TOOL) {
      searchCalls += 1;
      const query = stringArgument(call, 'query');
      if (query !== undefined) searchedQueries.add(normalizeQuery(query));
      const result = searchResultSchema.safeParse(parseJson(splitCitationKey(message.content).body));
      if (result.success) {
        for (const hit of result.data.results) scores.set(hit.id, (scores.get(hit.id) ?? 0) + hit.score);
      }
    } else {
      const reader = name === READ_TOOL ? CORPUS_READER : name === FETCH_PAGE_TOOL ? WEB_READER : null;
      if (reader === null) continue;
      const named = stringArgument(call, reader.argument);
      if (named !== undefined) attemptedReads.add(named.trim());
      const { body, entries } = splitCitationKey(message.content);
      const document = reader.documentOf(parseJson(body));
      if (document !== null && !reads.some((read) => read.id === document.id)) {
        // The document's own ID may differ from the one asked for (a page's URL after a redirect): neither is read again.
        attemptedReads.add(document.id);
        const citation = entries.find((entry) => entry.url === reader.citationUrl(document.id))?.number;
        reads.push(citation === undefined ? document : { ...document, citation });
      }
    }
  }
  const ranking = [...scores.entries()]
    .sort(([leftId, left], [rightId, right]) => right - left || (leftId < rightId ? -1 : leftId > rightId ? 1 : 0))
    .map(([id]) => id);
  return { searchCalls, searchedQueries, ranking, attemptedReads, reads, assistantTurns };
}

interface Candidate {
  readonly source: number;
  readonly position: number;
  readonly sentence: string;
  readonly words: number;
  readonly score: number;
  readonly tieBreak: number;
}

/**
 * The final answer: the note, then one paragraph of copied sentences per source that contributed,
 * each ending with the source's citation; a source without a number is named in a "Sources:" line.
 */
export function composeAnswer(
  seed: number,
  plan: Pick<Plan, 'prompt' | 'terms' | 'targetWords'>,
  reads: readonly ReadDocument[],
  reader: Pick<Reader, 'note' | 'nothingFound' | 'wholeSentencesOnly'> = CORPUS_READER,
): string {
  if (reads.length === 0) return `${reader.note}\n\n${reader.nothingFound}`;
  const terms = new Set(plan.terms);
  const candidates: Candidate[] = [];
  reads.forEach((read, source) => {
    splitParagraphs(read.text)
      .flatMap(splitSentences)
      .filter((sentence) => !reader.wholeSentencesOnly || (WHOLE_SENTENCE.test(sentence) && countWords(sentence) >= MIN_SENTENCE_WORDS))
      .forEach((sentence, position) => {
        const score = distinctTerms(sentence).filter((term) => terms.has(term)).length;
        const tieBreak = unitInterval(seed, 'sentence', plan.prompt, read.id, position);
        candidates.push({ source, position, sentence, words: countWords(sentence), score, tieBreak });
      });
  });
  const byMerit = [...candidates].sort((left, right) => right.score - left.score || left.tieBreak - right.tieBreak);
  const chosen = new Set<Candidate>();
  let words = 0;
  const take = (candidate: Candidate): void => {
    if (chosen.has(candidate)) return;
    if (words >= plan.targetWords) return;
    if (words > 0 && words + candidate.words > plan.targetWords * 1.25) return;
    chosen.add(candidate);
    words += candidate.words;
  };
  // Every source contributes its best sentence first, then the best of the rest fill the target.
  for (let source = 0; source < reads.length; source += 1) {
    const best = byMerit.find((candidate) => candidate.source === source);
    if (best !== undefined) take(best);
  }
  for (const candidate of byMerit) take(candidate);

  const paragraphs: string[] = [];
  const uncited: string[] = [];
  reads.forEach((read, source) => {
    const sentences = candidates.filter((candidate) => candidate.source === source && chosen.has(candidate)).map((candidate) => candidate.sentence);
    if (sentences.length === 0) return;
    if (read.citation === undefined) uncited.push(read.title);
    paragraphs.push(read.citation === undefined ? sentences.join(' ') : `${sentences.join(' ')} [${read.citation}]`);
  });
  return [reader.note, ...paragraphs, ...(uncited.length > 0 ? [`Sources: ${uncited.join('; ')}.`] : [])].join('\n\n');
}

function toolCallsFor(seed: number, messages: readonly ChatMessage[], prompt: string, calls: readonly { name: string; arguments: Record<string, unknown> }[]): ToolCall[] {
  const wire = calls.map((call) => ({ name: call.name, arguments: JSON.stringify(call.arguments) }));
  const groupDigest = digest(`${seed}\u001f${messages.length}\u001f${prompt}\u001f${JSON.stringify(wire)}`);
  return wire.map((call, position) => ({ id: groupCallId(groupDigest, position), ...call }));
}

/**
 * The agent's next assistant message for a transcript. Throws ProviderRequestError, as a real API
 * would, for a transcript with unresolved tool calls or no user prompt.
 */
export function nextAgentTurn(seed: number, messages: readonly ChatMessage[], tools: readonly ToolSpec[]): AgentTurn {
  assertSoundTranscript(messages);
  const promptIndex = lastPromptIndex(messages);
  const promptMessage = messages[promptIndex];
  if (promptMessage?.role !== 'user') throw new ProviderRequestError('Transcript has no user message to answer');
  // The prompt's citation key lists sources to cite, not words of the subject.
  const plan = planFor(seed, splitCitationKey(promptMessage.content).body);
  const progress = progressOf(messages.slice(promptIndex + 1));
  const canSearch = tools.some((tool) => tool.name === SEARCH_TOOL);
  const offered = new Set(tools.map((tool) => tool.name));
  // The corpus tools when offered (as before); otherwise the web's fetch_page, if it is there.
  const reader = offered.has(READ_TOOL) ? CORPUS_READER : offered.has(FETCH_PAGE_TOOL) ? WEB_READER : null;

  if (progress.assistantTurns < MAX_AGENT_TURNS) {
    const pendingQueries =
      progress.searchCalls >= plan.queries.length ? [] : plan.queries.filter((query) => !progress.searchedQueries.has(normalizeQuery(query)));
    if (canSearch && pendingQueries.length > 0) {
      const queries = plan.groupSearches ? pendingQueries : pendingQueries.slice(0, 1);
      return {
        content: `Offline simulator: searching ${(reader ?? CORPUS_READER).searched} for ${queries.map((query) => `"${query}"`).join(' and ')}.`,
        toolCalls: toolCallsFor(
          seed,
          messages,
          plan.prompt,
          queries.map((query) => ({ name: SEARCH_TOOL, arguments: { query } })),
        ),
      };
    }
    const needed = plan.readCount - progress.reads.length;
    if (reader !== null && needed > 0 && progress.attemptedReads.size < plan.readCount + 2) {
      const unread = progress.ranking.filter((target) => !progress.attemptedReads.has(target)).slice(0, needed);
      const targets = plan.groupReads ? unread : unread.slice(0, 1);
      if (targets.length > 0) {
        return {
          content: `Offline simulator: ${reader.verb} ${targets.join(', ')}.`,
          toolCalls: toolCallsFor(
            seed,
            messages,
            plan.prompt,
            targets.map((target) => ({ name: reader.tool, arguments: { [reader.argument]: target } })),
          ),
        };
      }
    }
  }
  if (progress.reads.length === 0 && !canSearch && reader === null) {
    return { content: `${OFFLINE_NOTE}\n\nNo ${SEARCH_TOOL} or ${READ_TOOL} tool was offered with this request, so nothing was read.`, toolCalls: [] };
  }
  return { content: composeAnswer(seed, plan, progress.reads, reader ?? CORPUS_READER), toolCalls: [] };
}
