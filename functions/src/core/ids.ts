/**
 * IDs that arrive from outside (a request body, a task payload, a pipeline's unit list) and
 * become Firestore document IDs. Firestore refuses some strings as IDs with INVALID_ARGUMENT; if
 * one got that far, an HTTP caller would get a 500 and a task would be redelivered until Cloud
 * Tasks gives up. Every such ID is checked here first, so a bad one is refused where it enters.
 */
import { z } from 'zod';

/** The longest ID accepted from outside. */
export const MAX_ID_LENGTH = 128;

/** Firestore's own limit on a document ID, in UTF-8 bytes. */
export const FIRESTORE_ID_MAX_BYTES = 1500;

/**
 * Letters, digits, `_` and `-`: what the engine's own IDs use, and all that Cloud Tasks allows in
 * a task name, which embeds the job ID.
 */
const ID_ALPHABET = /^[A-Za-z0-9_-]+$/;

/** A lone surrogate cannot be encoded as UTF-8; in `u` mode a well-formed pair is one code point, not `Cs`. */
const LONE_SURROGATE = /\p{Cs}/u;

/**
 * Why Firestore itself would refuse `id` as a document ID, or null when it accepts it. These are
 * the documented rules; test/emulator/ids.test.ts checks them against the official emulator.
 */
export function firestoreRefusal(id: string): string | null {
  if (id.length === 0) return 'is empty';
  if (id === '.' || id === '..') return `is "${id}", which Firestore does not allow as an ID`;
  if (/^__[\s\S]*__$/.test(id)) return 'has the form __name__, which is reserved by Firestore';
  if (id.includes('/')) return 'contains "/", which would make it a path rather than an ID';
  if (LONE_SURROGATE.test(id)) return 'is not valid Unicode text';
  const bytes = Buffer.byteLength(id, 'utf8');
  if (bytes > FIRESTORE_ID_MAX_BYTES) return `is ${bytes} bytes long; Firestore allows at most ${FIRESTORE_ID_MAX_BYTES}`;
  return null;
}

/** Why `id` is refused as an ID from outside, or null when it is accepted. */
export function documentIdProblem(id: string): string | null {
  if (id.length === 0) return 'must not be empty';
  const rule = `must be 1 to ${MAX_ID_LENGTH} letters, digits, "_" or "-"`;
  if (!ID_ALPHABET.test(id)) return rule;
  if (id.length > MAX_ID_LENGTH) return `${rule} (it is ${id.length} characters long)`;
  // The alphabet already rules out most of Firestore's refusals, not the reserved __name__ form.
  return firestoreRefusal(id);
}

/** A zod schema for an ID from outside; messages start with `field` so that they read as sentences. */
export function documentId(field: string): z.ZodType<string> {
  return z.string({ error: `${field} must be a string` }).superRefine((value, context) => {
    const problem = documentIdProblem(value);
    if (problem !== null) context.addIssue({ code: 'custom', message: `${field} ${problem}` });
  });
}

/** The same check as a predicate. */
export function isDocumentId(value: unknown): value is string {
  return typeof value === 'string' && documentIdProblem(value) === null;
}
