/**
 * Transcript soundness, warm-retry repair and compaction for tool-calling conversations.
 *
 * A tool group is an assistant message with a non-empty `toolCalls` list followed directly by the
 * run of tool messages that answer it. A transcript is sound when every call has exactly one result
 * and that result sits inside the call's own group: nothing unanswered, nothing orphaned, nothing
 * doubled, no call ID reused. Providers reject anything else, and continuing such a transcript
 * would mean guessing what happened (rule 4).
 *
 * Pure functions only: no I/O, no Firebase, no clock.
 */
import type { ChatMessage, NumberedSource, Source, ToolCall } from './provider';

type AssistantMessage = Extract<ChatMessage, { role: 'assistant' }>;
type ToolMessage = Extract<ChatMessage, { role: 'tool' }>;

export type TranscriptProblemKind =
  /** A tool call with no result anywhere after it. */
  | 'unanswered_call'
  /** A tool result whose call ID no earlier assistant message made. */
  | 'orphan_result'
  /** A second result for a call that already has one. */
  | 'duplicate_result'
  /** A result for a known call that is not in the run of tool messages right after that call. */
  | 'misplaced_result'
  /** A call ID made a second time (in the same assistant message or a later one). */
  | 'duplicate_call_id'
  /** A result whose tool name differs from the name of the call it answers. */
  | 'result_name_mismatch';

/** Something in a transcript that makes it unsafe to continue (an unresolved or orphaned tool call), with the message and call it is in. */
export interface TranscriptProblem {
  readonly kind: TranscriptProblemKind;
  /** Index of the message where the problem shows (the assistant message for an unanswered call). */
  readonly index: number;
  readonly toolCallId: string;
}

/** Human-readable form of a problem, for reasons and timeline notes. */
export function describeProblem(problem: TranscriptProblem): string {
  const what: Record<TranscriptProblemKind, string> = {
    unanswered_call: 'tool call without a result',
    orphan_result: 'tool result for an unknown call',
    duplicate_result: 'second result for one tool call',
    misplaced_result: 'tool result outside its call group',
    duplicate_call_id: 'tool call ID used twice',
    result_name_mismatch: 'tool result name differs from its call',
  };
  return `${what[problem.kind]} (${problem.toolCallId}) at message ${problem.index}`;
}

/** Lists every soundness problem, ordered by message index. An empty list means the transcript is sound. */
export function findProblems(messages: readonly ChatMessage[]): TranscriptProblem[] {
  const problems: TranscriptProblem[] = [];
  const calls = new Map<string, { index: number; name: string; answered: boolean }>();
  /** Call IDs of the group whose tool-message run is still going on. */
  let open = new Set<string>();

  messages.forEach((message, index) => {
    if (message.role === 'tool') {
      const toolCallId = message.toolCallId;
      const call = calls.get(toolCallId);
      if (call === undefined) {
        problems.push({ kind: 'orphan_result', index, toolCallId });
      } else if (call.answered) {
        problems.push({ kind: 'duplicate_result', index, toolCallId });
      } else {
        // One defect, one problem: a late result is reported as misplaced, not also as unanswered.
        call.answered = true;
        if (!open.has(toolCallId)) problems.push({ kind: 'misplaced_result', index, toolCallId });
        else if (message.name !== call.name) problems.push({ kind: 'result_name_mismatch', index, toolCallId });
      }
      return;
    }
    open = new Set();
    if (message.role !== 'assistant') return;
    for (const call of message.toolCalls ?? []) {
      if (calls.has(call.id)) {
        problems.push({ kind: 'duplicate_call_id', index, toolCallId: call.id });
        continue;
      }
      calls.set(call.id, { index, name: call.name, answered: false });
      open.add(call.id);
    }
  });

  for (const [toolCallId, call] of calls) {
    if (!call.answered) problems.push({ kind: 'unanswered_call', index: call.index, toolCallId });
  }
  // Stable sort: problems found at the same message keep their discovery order.
  return problems.sort((a, b) => a.index - b.index);
}

export type WarmRepair =
  | {
      readonly sound: true;
      /**
       * The transcript to continue: the prefix through the prompt, then complete groups (results in
       * call order), then possibly the trailing group with the results it has.
       */
      readonly messages: ChatMessage[];
      /**
       * Calls of that trailing group with no recorded result, in call order: run these (and only
       * these) before the next model call. Its recorded results are kept, never executed again.
       */
      readonly openCalls: ToolCall[];
      /** The original messages after the kept part, in their original order: work thrown away. */
      readonly dropped: ChatMessage[];
      /** Why the walk stopped early, or null when every message was kept. */
      readonly stoppedBecause: string | null;
    }
  | { readonly sound: false; readonly reason: string };

/**
 * Cuts a transcript back to what can be continued on the same thread (a warm retry).
 *
 * Keeps everything up to and including the latest user message carrying `promptId`, then only
 * complete tool groups, stopping at the first broken group or unexpected message. A group that
 * ends the transcript with some results missing (the worker died between two tool calls) is kept
 * with the results it has: a recorded tool call is never run twice, so the caller runs only the
 * missing calls. Results that arrived in another order than the calls are put back in call order.
 * The kept transcript is checked again as a whole; anything that cannot be shown sound is refused,
 * never guessed at.
 */
export function repairForWarmRetry(messages: readonly ChatMessage[], promptId: string): WarmRepair {
  const promptIndex = messages.findLastIndex((message) => message.role === 'user' && message.promptId === promptId);
  if (promptIndex < 0) return { sound: false, reason: `the transcript has no prompt ${promptId}` };

  const kept = messages.slice(0, promptIndex + 1);
  const prefixProblems = findProblems(kept);
  const firstPrefixProblem = prefixProblems[0];
  if (firstPrefixProblem !== undefined) {
    return { sound: false, reason: `the transcript up to prompt ${promptId} is unsound: ${describeProblem(firstPrefixProblem)}` };
  }

  const usedIds = new Set(kept.flatMap((message) => (message.role === 'assistant' ? (message.toolCalls ?? []).map((call) => call.id) : [])));
  let next = promptIndex + 1;
  let stoppedBecause: string | null = null;
  let openCalls: ToolCall[] = [];
  while (next < messages.length) {
    const group = readGroup(messages, next, usedIds);
    if (group.kind === 'broken') {
      stoppedBecause = group.reason;
      break;
    }
    const trailing = group.end === messages.length;
    if (group.kind === 'partial' && !trailing) {
      // Something follows a group that was never finished: not a state a worker leaves; refuse it.
      stoppedBecause = `incomplete tool group at ${next}: ${group.results.length} of ${group.call.toolCalls?.length ?? 0} results`;
      break;
    }
    kept.push(group.call, ...group.results);
    for (const call of group.call.toolCalls ?? []) usedIds.add(call.id);
    next = group.end;
    if (group.kind === 'partial') openCalls = group.missing;
  }

  // The walk only admits sound groups; this re-check is the proof, not a formality.
  const keptProblems = findResumeProblems(kept);
  const firstKeptProblem = keptProblems[0];
  if (firstKeptProblem !== undefined) {
    return { sound: false, reason: `the repaired transcript is unsound: ${describeProblem(firstKeptProblem)}` };
  }
  return { sound: true, messages: kept, openCalls, dropped: messages.slice(next), stoppedBecause };
}

/**
 * The calls of the group that ends the transcript which have no result yet, in call order; empty
 * when the transcript does not end inside a tool group.
 */
export function openToolCalls(messages: readonly ChatMessage[]): ToolCall[] {
  let start = messages.length - 1;
  while (messages[start]?.role === 'tool') start -= 1;
  const head = messages[start];
  if (head?.role !== 'assistant') return [];
  const answered = new Set(messages.slice(start + 1).flatMap((message) => (message.role === 'tool' ? [message.toolCallId] : [])));
  return (head.toolCalls ?? []).filter((call) => !answered.has(call.id));
}

/**
 * Problems that stop a transcript from being continued: every problem except the open calls of
 * its trailing group, which the caller is about to run. Empty means: run the open calls, then the
 * transcript is sound.
 */
export function findResumeProblems(messages: readonly ChatMessage[]): TranscriptProblem[] {
  const open = new Set(openToolCalls(messages).map((call) => call.id));
  return findProblems(messages).filter((problem) => !(problem.kind === 'unanswered_call' && open.has(problem.toolCallId)));
}

type GroupRead =
  | { readonly kind: 'complete'; readonly call: AssistantMessage; readonly results: ToolMessage[]; readonly end: number }
  /** Every result present answers the group once; `missing` are the calls without one. */
  | { readonly kind: 'partial'; readonly call: AssistantMessage; readonly results: ToolMessage[]; readonly missing: ToolCall[]; readonly end: number }
  | { readonly kind: 'broken'; readonly reason: string };

/**
 * Reads the group starting at `start`: the assistant message and the whole run of tool messages
 * after it. A run with a foreign or doubled result is refused as a whole, since keeping any of it
 * would mean choosing which recorded result is the real one. Results come back in call order.
 */
function readGroup(messages: readonly ChatMessage[], start: number, usedIds: ReadonlySet<string>): GroupRead {
  const head = messages[start];
  if (head === undefined) return { kind: 'broken', reason: `no message at ${start}` };
  if (head.role !== 'assistant') return { kind: 'broken', reason: `unexpected ${head.role} message at ${start}` };
  const calls = head.toolCalls ?? [];
  if (calls.length === 0) return { kind: 'broken', reason: `assistant message without tool calls at ${start}` };

  const callsById = new Map<string, ToolCall>();
  for (const call of calls) {
    if (callsById.has(call.id) || usedIds.has(call.id)) return { kind: 'broken', reason: `tool call ID ${call.id} reused at ${start}` };
    callsById.set(call.id, call);
  }

  const resultsById = new Map<string, ToolMessage>();
  let end = start + 1;
  for (let message = messages[end]; message?.role === 'tool'; message = messages[end]) {
    const call = callsById.get(message.toolCallId);
    if (call === undefined) return { kind: 'broken', reason: `tool result ${message.toolCallId} at ${end} does not answer the group at ${start}` };
    if (resultsById.has(message.toolCallId)) return { kind: 'broken', reason: `second result for ${message.toolCallId} at ${end}` };
    if (message.name !== call.name) return { kind: 'broken', reason: `tool result ${message.toolCallId} at ${end} names ${message.name}, the call names ${call.name}` };
    resultsById.set(message.toolCallId, message);
    end += 1;
  }

  const results: ToolMessage[] = [];
  const missing: ToolCall[] = [];
  for (const call of calls) {
    const result = resultsById.get(call.id);
    if (result === undefined) missing.push(call);
    else results.push(result);
  }
  return missing.length === 0 ? { kind: 'complete', call: head, results, end } : { kind: 'partial', call: head, results, missing, end };
}

/** Estimates the tokens a list of messages takes: about one token per four characters, plus a small per-message overhead. */
export function estimateTokens(messages: readonly ChatMessage[]): number {
  const PER_MESSAGE_OVERHEAD = 4;
  let total = 0;
  for (const message of messages) {
    let characters = message.content?.length ?? 0;
    if (message.role === 'assistant') {
      for (const call of message.toolCalls ?? []) characters += call.id.length + call.name.length + call.arguments.length;
    } else if (message.role === 'tool') {
      characters += message.toolCallId.length + message.name.length;
    }
    total += Math.ceil(characters / 4) + PER_MESSAGE_OVERHEAD;
  }
  return total;
}

export type TokenEstimator = (messages: readonly ChatMessage[]) => number;

const STUB_PREFIX = '[compacted:';

/** The short text that stands in for a compacted tool result; it keeps the result's pairing. */
export function compactionStub(result: ToolMessage): string {
  return `${STUB_PREFIX} ${result.content.length} characters of ${result.name} results]`;
}

/**
 * Shrinks a sound transcript below `targetTokens` without breaking any call/result pairing.
 *
 * In order, stopping as soon as the estimate fits:
 * 1. replace the content of tool results with a stub, oldest first, leaving the newest group alone;
 * 2. drop whole groups that follow the last user message (the prompt), oldest first, again sparing the newest group;
 * 3. stub the newest group's results too.
 *
 * System and user messages are never touched. Returns null when the transcript is unsound (compacting
 * a broken transcript only gives a smaller broken one) or when it cannot be brought under the target.
 */
export function compactTranscript(
  messages: readonly ChatMessage[],
  targetTokens: number,
  estimate: TokenEstimator = estimateTokens,
): ChatMessage[] | null {
  if (findProblems(messages).length > 0) return null;
  let current = [...messages];
  const fits = (): boolean => estimate(current) <= targetTokens;
  if (fits()) return current;

  const newestGroupStart = current.findLastIndex(isToolGroupHead);
  const stubResults = (from: number, to: number): boolean => {
    for (let index = from; index < to; index += 1) {
      const message = current[index];
      if (message?.role !== 'tool' || message.content.startsWith(STUB_PREFIX)) continue;
      const stub = compactionStub(message);
      if (stub.length >= message.content.length) continue;
      current[index] = { ...message, content: stub };
      if (fits()) return true;
    }
    return false;
  };

  // 1. Older tool results (everything before the newest group; in a sound transcript no result precedes its group).
  if (stubResults(0, Math.max(newestGroupStart, 0))) return verified(current);

  // 2. Older whole groups after the prompt. The newest group keeps its place, so its start only shifts down.
  const promptIndex = current.findLastIndex((message) => message.role === 'user');
  for (;;) {
    const newest = current.findLastIndex(isToolGroupHead);
    const oldest = current.findIndex((message, index) => index > promptIndex && index < newest && isToolGroupHead(message));
    if (oldest < 0) break;
    current = [...current.slice(0, oldest), ...current.slice(groupEnd(current, oldest))];
    if (fits()) return verified(current);
  }

  // 3. The newest group's results, as a last resort.
  const newest = current.findLastIndex(isToolGroupHead);
  if (newest >= 0 && stubResults(newest, groupEnd(current, newest))) return verified(current);
  return null;
}

function isToolGroupHead(message: ChatMessage): message is AssistantMessage {
  return message.role === 'assistant' && (message.toolCalls?.length ?? 0) > 0;
}

/** Index just past the tool-message run of the group whose head is at `start`. */
function groupEnd(messages: readonly ChatMessage[], start: number): number {
  let end = start + 1;
  while (messages[end]?.role === 'tool') end += 1;
  return end;
}

function verified(messages: ChatMessage[]): ChatMessage[] | null {
  return findProblems(messages).length === 0 ? messages : null;
}

/**
 * Tool rounds the model has taken since the section's latest prompt: read from the transcript
 * itself, so the limit holds across steps and crashes (a counter in memory would start again at
 * zero in every step, and a slow section could yield for ever).
 */
export function toolRoundsSincePrompt(messages: readonly ChatMessage[], promptId: string): number {
  const promptIndex = messages.findLastIndex((message) => message.role === 'user' && message.promptId === promptId);
  return messages.slice(promptIndex + 1).filter((message) => message.role === 'assistant' && (message.toolCalls?.length ?? 0) > 0).length;
}

// ---- Citations ------------------------------------------------------------------------------------
//
// Sources are numbered per thread in the order the thread first shows them (the prompt's own
// sources first, then each tool result's), a URL keeping the number it was first given, and every
// message that shows sources ends its text with a key of `[n] Title <url>` lines. Why this scheme:
// the model cites a number printed right beside the evidence, with no counting and no long URLs to
// copy; the numbers are recorded with the messages (`sources`), so a resumed thread keeps them and
// a compacted result loses its text but not what its numbers meant; a clean thread drops them with
// its messages and starts again from 1. The report renumbers once for the whole document.

/** The line that opens a citation key; the key is always the last part of a message's text. */
export const CITATION_KEY_HEADING = 'Sources (cite as [n]):';
const CITATION_KEY_SEPARATOR = `\n\n${CITATION_KEY_HEADING}\n`;
const KEY_TITLE_CHARS = 200;

/** What two citations of the same source share: the URL as parsed, without its fragment. */
export function sourceKey(url: string): string {
  try {
    const parsed = new URL(url.trim());
    parsed.hash = '';
    return parsed.href;
  } catch {
    return url.trim();
  }
}

/** A URL that cannot end a line early or break out of `<...>`: whitespace, `<` and `>` percent-encoded. */
export function urlForText(url: string): string {
  return url.trim().replace(/[\s<>]/g, (character) => `%${character.charCodeAt(0).toString(16).toUpperCase().padStart(2, '0')}`);
}

/** A title on one line, of a sane length. */
export function titleForText(title: string, maxChars = KEY_TITLE_CHARS): string {
  const line = title.replace(/\s+/g, ' ').trim();
  return line.length <= maxChars ? line : `${line.slice(0, maxChars - 1).trimEnd()}…`;
}

/** Every numbered source the thread shows, one per number (its latest record), by number. */
export function threadSources(messages: readonly ChatMessage[]): NumberedSource[] {
  const byNumber = new Map<number, NumberedSource>();
  for (const message of messages) {
    if (message.role !== 'user' && message.role !== 'tool') continue;
    for (const source of message.sources ?? []) byNumber.set(source.number, source);
  }
  return [...byNumber.values()].sort((left, right) => left.number - right.number);
}

/**
 * Numbers the sources a new message shows, continuing the thread's numbering: a source the thread
 * already numbered keeps its number, a new one takes the next. Repeats within `fresh` are dropped.
 */
export function numberSources(messages: readonly ChatMessage[], fresh: readonly Source[]): NumberedSource[] {
  const known = new Map<string, number>();
  let highest = 0;
  for (const source of threadSources(messages)) {
    if (!known.has(sourceKey(source.url))) known.set(sourceKey(source.url), source.number);
    highest = Math.max(highest, source.number);
  }
  const numbered: NumberedSource[] = [];
  const shown = new Set<string>();
  for (const source of fresh) {
    const key = sourceKey(source.url);
    if (shown.has(key)) continue;
    shown.add(key);
    let number = known.get(key);
    if (number === undefined) {
      highest += 1;
      number = highest;
      known.set(key, number);
    }
    const { url, title, passage, fetchedAt, artifact } = source;
    numbered.push(artifact === undefined ? { url, title, passage, fetchedAt, number } : { url, title, passage, fetchedAt, artifact, number });
  }
  return numbered;
}

/** The text a message ends with to show its numbered sources; empty for none. */
export function citationKey(sources: readonly NumberedSource[]): string {
  if (sources.length === 0) return '';
  return `${CITATION_KEY_SEPARATOR}${sources.map((source) => `[${source.number}] ${titleForText(source.title) || 'Untitled'} <${urlForText(source.url)}>`).join('\n')}`;
}

export interface CitationKeyEntry {
  readonly number: number;
  readonly title: string;
  readonly url: string;
}

/** A message text split into what came before its citation key and the key's entries (none without a key). */
export function splitCitationKey(content: string): { readonly body: string; readonly entries: CitationKeyEntry[] } {
  const at = content.lastIndexOf(CITATION_KEY_SEPARATOR);
  if (at < 0) return { body: content, entries: [] };
  const entries = content
    .slice(at + CITATION_KEY_SEPARATOR.length)
    .split('\n')
    .flatMap((line) => {
      const match = /^\[(\d+)\] (.*) <([^<>\s]+)>$/.exec(line);
      return match?.[1] === undefined || match[2] === undefined || match[3] === undefined ? [] : [{ number: Number(match[1]), title: match[2], url: match[3] }];
    });
  return { body: content.slice(0, at), entries };
}

/** The message as a provider may see it: the `sources` bookkeeping left out. */
export function withoutSources(message: ChatMessage): ChatMessage {
  if ((message.role !== 'user' && message.role !== 'tool') || message.sources === undefined) return message;
  const { sources: _recorded, ...visible } = message;
  return visible;
}
