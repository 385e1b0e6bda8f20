/**
 * A section's transcript as an append-only log: each save is one new document holding only what
 * changed since the save before it (the messages appended, and how many of the earlier ones it
 * keeps), never the whole transcript again. The bytes written per section grow linearly with its
 * length, and no single document has to hold the whole thread.
 *
 * A transcript shaped `{ messages: [...], ...head }` (the agent's) is stored that way: a save keeps
 * the longest unchanged prefix of the stored messages (a warm retry's repair drops some, a clean
 * thread keeps none) and appends the rest, with the head (generation, attempts, tally) in full.
 * Any other value is stored whole in its save. Loading replays the saves in order; a log with a
 * gap or a save that keeps more than there was is returned as an unreadable marker, which the
 * pipeline's validation refuses (never trusted, never silently empty).
 *
 * Documents written before this log existed (`transcripts/{sectionKey}` with the whole transcript)
 * are read as the log's starting point.
 *
 * Big contents are not stored inline: a message content over OFFLOAD_CONTENT_BYTES (a tool result
 * above all), and the largest further ones while the save would be over SAVE_DOCUMENT_BUDGET_BYTES,
 * go to the job's artifact store (store/artifact-store.ts); the save holds `content: null` there and
 * lists `{ index, sha256, size }` under `offloaded`. A whole value over the threshold is stored the
 * same way (`wholeArtifact`). Loading fetches each one and checks its hash and size; a missing or
 * altered artifact makes the transcript load as the unreadable marker, never as a shorter thread.
 */
import type { DocumentData } from 'firebase-admin/firestore';
import { ArtifactUnreadableError, type ArtifactCheck, type ArtifactStore } from './artifact-store';
import type { StoredDocument } from './checkpoint-reads';
import { TerminalError } from '../core/errors';

/** A message content larger than this (UTF-8 bytes) is kept as an artifact; its save holds the reference. */
export const OFFLOAD_CONTENT_BYTES = 256 * 1024;
/** A save still larger than this (JSON bytes) has its largest remaining contents offloaded too: well under the 1 MiB document limit. */
export const SAVE_DOCUMENT_BUDGET_BYTES = 512 * 1024;
const CONTENT_TYPE = 'text/plain; charset=utf-8';
const WHOLE_TYPE = 'application/json';

/** What the holder knows of a section's log after loading or saving it: the next save builds on it. */
export interface SectionLogState {
  /** Number of the last save (-1: none yet; 0 may be a document from before the log). */
  readonly save: number;
  /** The stored messages, serialized, to find what a save keeps; null when the value is not message-shaped. */
  readonly messageKeys: readonly string[] | null;
}

export const EMPTY_LOG: SectionLogState = { save: -1, messageKeys: null };

/** What a corrupt log loads as: it fails any transcript schema, so the pipeline refuses it by name. */
export interface UnreadableTranscript {
  readonly unreadableTranscript: string;
}

interface MessageShaped {
  readonly messages: readonly unknown[];
  readonly [field: string]: unknown;
}

function isMessageShaped(value: unknown): value is MessageShaped {
  return typeof value === 'object' && value !== null && !Array.isArray(value) && Array.isArray((value as { messages?: unknown }).messages);
}

function keysOf(messages: readonly unknown[]): string[] {
  return messages.map((message) => JSON.stringify(message));
}

/** The document one save writes (besides its identity fields), and the state after it. */
export function encodeSave(previous: SectionLogState, transcript: unknown): { document: DocumentData; next: SectionLogState } {
  const save = previous.save + 1;
  if (!isMessageShaped(transcript)) {
    return { document: { save, keep: null, whole: transcript ?? null }, next: { save, messageKeys: null } };
  }
  const { messages, ...head } = transcript;
  const keys = keysOf(messages);
  const stored = previous.messageKeys ?? [];
  let keep = 0;
  while (keep < stored.length && keep < keys.length && stored[keep] === keys[keep]) keep += 1;
  return { document: { save, keep, messages: messages.slice(keep), head }, next: { save, messageKeys: keys } };
}

/** Offloaded content the replayed transcript still lacks: a message's `content` (by position) or the whole value. */
interface PendingContent extends ArtifactCheck {
  readonly save: number;
  readonly at: number | 'whole';
}

interface Replayed {
  readonly transcript: unknown;
  readonly state: SectionLogState;
  readonly pending: readonly PendingContent[];
}

const byteLength = (text: string): number => Buffer.byteLength(text, 'utf8');

function isArtifactCheck(value: unknown): value is ArtifactCheck {
  const { sha256, size } = (value ?? {}) as { sha256?: unknown; size?: unknown };
  return typeof sha256 === 'string' && typeof size === 'number' && Number.isInteger(size) && size >= 0;
}

/** A save's `offloaded` list, checked against its messages; null when malformed. */
function offloadedOf(save: Record<string, unknown>, messages: readonly unknown[]): { index: number; sha256: string; size: number }[] | null {
  if (save.offloaded === undefined) return [];
  if (!Array.isArray(save.offloaded)) return null;
  const entries: { index: number; sha256: string; size: number }[] = [];
  for (const entry of save.offloaded as unknown[]) {
    const index = (entry as { index?: unknown } | null)?.index;
    if (!isArtifactCheck(entry) || typeof index !== 'number' || !Number.isInteger(index) || index < 0 || index >= messages.length) return null;
    if ((messages[index] as { content?: unknown } | null)?.content !== null) return null;
    entries.push({ index, sha256: entry.sha256, size: entry.size });
  }
  return entries;
}

/**
 * The replay itself: the transcript with offloaded contents still out (listed as `pending`). It
 * starts at the last save that kept nothing (a first save, a clean thread, a whole value): what
 * came before it does not matter, so a corrupt stretch the section has since started over from is
 * left behind.
 */
function replayLog(documents: readonly StoredDocument[]): Replayed {
  const fields = (document: StoredDocument): Record<string, unknown> => (document.data ?? {}) as Record<string, unknown>;
  const saves = documents.map(fields).filter((save) => typeof save.save === 'number');
  saves.sort((a, b) => (a.save as number) - (b.save as number));
  const legacy = documents.map(fields).filter((save) => typeof save.save !== 'number');
  const lastSave = saves.length > 0 ? (saves[saves.length - 1]?.save as number) : legacy.length > 0 ? 0 : -1;
  const unreadable = (why: string): Replayed => unreadableLog(why, lastSave);

  let from = saves.findLastIndex((save) => save.keep === 0 || save.keep === null);
  let transcript: unknown = null;
  let pending: PendingContent[] = [];
  let previous: number;
  if (from === -1) {
    // No fresh start among the saves: the log builds on the document from before it, if any.
    if (legacy.length > 1) return unreadable('more than one whole-transcript document');
    transcript = legacy[0]?.transcript ?? null;
    previous = legacy.length > 0 ? 0 : -1;
    from = 0;
  } else {
    previous = (saves[from]?.save as number) - 1;
  }
  for (const save of saves.slice(from)) {
    if (save.save !== previous + 1) return unreadable(`save ${String(save.save)} follows save ${previous}`);
    previous = save.save;
    if (save.keep === null) {
      transcript = save.whole ?? null;
      if (save.wholeArtifact === undefined) {
        pending = [];
      } else if (isArtifactCheck(save.wholeArtifact) && transcript === null) {
        pending = [{ save: previous, at: 'whole', sha256: save.wholeArtifact.sha256, size: save.wholeArtifact.size }];
      } else {
        return unreadable(`save ${previous} has a malformed whole-value reference`);
      }
      continue;
    }
    const kept = isMessageShaped(transcript) ? transcript.messages : [];
    if (typeof save.keep !== 'number' || save.keep > kept.length || !Array.isArray(save.messages) || typeof save.head !== 'object' || save.head === null) {
      return unreadable(`save ${String(save.save)} is malformed or keeps ${JSON.stringify(save.keep)} of ${kept.length} messages`);
    }
    const keep = save.keep;
    const appended = save.messages as unknown[];
    const offloaded = offloadedOf(save, appended);
    if (offloaded === null) return unreadable(`save ${previous} has a malformed list of offloaded contents`);
    pending = [
      ...pending.filter((entry) => typeof entry.at === 'number' && entry.at < keep),
      ...offloaded.map(({ index, sha256, size }) => ({ save: previous, at: keep + index, sha256, size })),
    ];
    transcript = { ...(save.head as Record<string, unknown>), messages: [...kept.slice(0, keep), ...appended] };
  }
  return { transcript, state: { save: lastSave, messageKeys: isMessageShaped(transcript) ? keysOf(transcript.messages) : null }, pending };
}

function unreadableLog(why: string, lastSave: number): Replayed {
  return { transcript: { unreadableTranscript: why } satisfies UnreadableTranscript, state: { save: lastSave, messageKeys: null }, pending: [] };
}

/**
 * One section's transcript from its stored documents (any order), and the state its next save
 * builds on, for a log with nothing offloaded; one that has offloaded content loads through
 * `loadSaves`, and here reads as unreadable rather than with contents missing.
 */
export function replaySaves(documents: readonly StoredDocument[]): { transcript: unknown; state: SectionLogState } {
  const replayed = replayLog(documents);
  if (replayed.pending.length > 0) return unreadableLog('the log has offloaded contents and was replayed without its artifact store', replayed.state.save);
  return { transcript: replayed.transcript, state: replayed.state };
}

/** One section's transcript, with every offloaded content fetched from the job's artifacts and checked. */
export async function loadSaves(documents: readonly StoredDocument[], artifacts: ArtifactStore, jobId: string): Promise<{ transcript: unknown; state: SectionLogState }> {
  const replayed = replayLog(documents);
  if (replayed.pending.length === 0) return { transcript: replayed.transcript, state: replayed.state };
  let transcript = replayed.transcript;
  for (const entry of replayed.pending) {
    let text: string;
    try {
      text = (await artifacts.get(jobId, entry)).toString('utf8');
    } catch (error) {
      if (!(error instanceof ArtifactUnreadableError)) throw error;
      const what = entry.at === 'whole' ? 'the whole value' : `message ${entry.at}`;
      return unreadableLog(`save ${entry.save}: the offloaded content of ${what} is unreadable (${error.fault})`, replayed.state.save);
    }
    if (entry.at === 'whole') {
      transcript = JSON.parse(text) as unknown;
    } else if (isMessageShaped(transcript)) {
      const messages = [...transcript.messages];
      messages[entry.at] = { ...(messages[entry.at] as Record<string, unknown>), content: text };
      transcript = { ...transcript, messages };
    }
  }
  return { transcript, state: { save: replayed.state.save, messageKeys: isMessageShaped(transcript) ? keysOf(transcript.messages) : null } };
}

/** The message's `content` when it is a string (the only kind offloaded). */
function contentOf(message: unknown): string | null {
  const content = (message as { content?: unknown } | null)?.content;
  return typeof content === 'string' ? content : null;
}

/**
 * The save document with its big contents moved to the job's artifacts (see the module comment);
 * the document as it was when nothing needs to move.
 */
export async function offloadLargeContents(document: DocumentData, artifacts: ArtifactStore, jobId: string): Promise<DocumentData> {
  if (document.keep === null) {
    const whole = JSON.stringify(document.whole ?? null);
    if (byteLength(whole) <= OFFLOAD_CONTENT_BYTES) return document;
    const { ref } = await artifacts.put(jobId, whole, { contentType: WHOLE_TYPE });
    return { ...document, whole: null, wholeArtifact: { sha256: ref.sha256, size: ref.size } };
  }
  const messages = document.messages as unknown[];
  const bySize = messages
    .map((message, index) => ({ index, content: contentOf(message) }))
    .filter((entry): entry is { index: number; content: string } => entry.content !== null)
    .map((entry) => ({ ...entry, bytes: byteLength(entry.content) }))
    .sort((a, b) => b.bytes - a.bytes);
  // The document's size as JSON: close to what Firestore counts, and on the safe side for strings.
  let estimate = byteLength(JSON.stringify(document));
  const chosen: { index: number; content: string }[] = [];
  for (const entry of bySize) {
    if (entry.bytes <= OFFLOAD_CONTENT_BYTES && estimate <= SAVE_DOCUMENT_BUDGET_BYTES) break;
    chosen.push(entry);
    estimate -= byteLength(JSON.stringify(entry.content));
  }
  if (chosen.length === 0) return document;
  // What is left (tool calls, sources, the head) is still too big: refuse the save, never commit one Firestore rejects.
  if (estimate > SAVE_DOCUMENT_BUDGET_BYTES) {
    throw new TerminalError(`A transcript save is about ${estimate} bytes without its message texts, over the ${SAVE_DOCUMENT_BUDGET_BYTES}-byte budget of one document`);
  }
  chosen.sort((a, b) => a.index - b.index);
  const stored = [...messages];
  const offloaded: { index: number; sha256: string; size: number }[] = [];
  for (const { index, content } of chosen) {
    const { ref } = await artifacts.put(jobId, content, { contentType: CONTENT_TYPE });
    stored[index] = { ...(messages[index] as Record<string, unknown>), content: null };
    offloaded.push({ index, sha256: ref.sha256, size: ref.size });
  }
  return { ...document, messages: stored, offloaded };
}

/** Stored transcript documents grouped by the section they belong to (their `id` field). */
export function groupBySection(documents: readonly StoredDocument[]): Map<string, StoredDocument[]> {
  const groups = new Map<string, StoredDocument[]>();
  for (const document of documents) {
    const id = (document.data as { id?: unknown } | null)?.id;
    if (typeof id !== 'string') continue;
    groups.set(id, [...(groups.get(id) ?? []), document]);
  }
  return groups;
}
