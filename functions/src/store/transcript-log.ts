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
 */
import type { DocumentData } from 'firebase-admin/firestore';
import type { StoredDocument } from './checkpoint-reads';

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

/**
 * One section's transcript from its stored documents (any order), and the state its next save
 * builds on. Replay starts at the last save that kept nothing (a first save, a clean thread, a
 * whole value): what came before it does not matter, so a corrupt stretch the section has since
 * started over from is left behind.
 */
export function replaySaves(documents: readonly StoredDocument[]): { transcript: unknown; state: SectionLogState } {
  const fields = (document: StoredDocument): Record<string, unknown> => (document.data ?? {}) as Record<string, unknown>;
  const saves = documents.map(fields).filter((save) => typeof save.save === 'number');
  saves.sort((a, b) => (a.save as number) - (b.save as number));
  const legacy = documents.map(fields).filter((save) => typeof save.save !== 'number');
  const lastSave = saves.length > 0 ? (saves[saves.length - 1]?.save as number) : legacy.length > 0 ? 0 : -1;
  const unreadable = (why: string) => ({ transcript: { unreadableTranscript: why } satisfies UnreadableTranscript, state: { save: lastSave, messageKeys: null } });

  let from = saves.findLastIndex((save) => save.keep === 0 || save.keep === null);
  let transcript: unknown = null;
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
      continue;
    }
    const kept = isMessageShaped(transcript) ? transcript.messages : [];
    if (typeof save.keep !== 'number' || save.keep > kept.length || !Array.isArray(save.messages) || typeof save.head !== 'object' || save.head === null) {
      return unreadable(`save ${String(save.save)} is malformed or keeps ${JSON.stringify(save.keep)} of ${kept.length} messages`);
    }
    transcript = { ...(save.head as Record<string, unknown>), messages: [...kept.slice(0, save.keep), ...(save.messages as unknown[])] };
  }
  return { transcript, state: { save: lastSave, messageKeys: isMessageShaped(transcript) ? keysOf(transcript.messages) : null } };
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
