/**
 * The stored transcript's schema: what `jobs/{jobId}/transcripts/{sectionId}` holds while a section
 * is in flight. A transcript read back is parsed by it before any worker continues the thread; one
 * that fails is refused (the section starts a clean thread) rather than trusted.
 */
import { z } from 'zod';
import type { StoredTranscript } from './section-runner';

const toolCall = z.object({ id: z.string(), name: z.string(), arguments: z.string() });
/** Fields in the order the runner writes them, so a loaded message serializes as it was saved. */
const numberedSource = z.object({
  url: z.string(),
  title: z.string(),
  passage: z.string(),
  fetchedAt: z.string(),
  artifact: z.object({ ref: z.string(), sha256: z.string(), size: z.number() }).optional(),
  number: z.number().int().positive(),
});
// `sources` is optional: transcripts saved before sources were recorded still load.
const chatMessage = z.discriminatedUnion('role', [
  z.object({ role: z.literal('system'), content: z.string() }),
  z.object({ role: z.literal('user'), content: z.string(), promptId: z.string().optional(), sources: z.array(numberedSource).optional() }),
  z.object({ role: z.literal('assistant'), content: z.string().nullable(), toolCalls: z.array(toolCall).optional() }),
  z.object({ role: z.literal('tool'), toolCallId: z.string(), name: z.string(), content: z.string(), sources: z.array(numberedSource).optional() }),
]);
const tallySchema = z.object({
  modelCalls: z.number(),
  toolCalls: z.number(),
  inputTokens: z.number(),
  outputTokens: z.number(),
  usd: z.number(),
  wastedModelCalls: z.number(),
  wastedToolCalls: z.number(),
  wastedInputTokens: z.number(),
  wastedOutputTokens: z.number(),
  wastedUsd: z.number(),
});

/** A section's stored transcript: its generation, messages, retries spent and cumulative cost. */
export const storedTranscriptSchema = z.object({
  generation: z.number().int().nonnegative(),
  messages: z.array(chatMessage),
  attempts: z.object({ warm: z.number().int().nonnegative(), cold: z.number().int().nonnegative() }),
  tally: tallySchema,
});

/** A stored transcript as read back: validated, or null (with why) when it cannot be trusted. */
export function parseStoredTranscript(stored: unknown): { readonly ok: true; readonly transcript: StoredTranscript } | { readonly ok: false; readonly reason: string } {
  const parsed = storedTranscriptSchema.safeParse(stored);
  if (parsed.success) return { ok: true, transcript: parsed.data as StoredTranscript };
  return { ok: false, reason: z.prettifyError(parsed.error).replace(/\s*\n\s*/g, '; ') };
}

/** The transcript as Firestore stores it: without optional fields that are unset (Firestore drops `undefined`). */
export function storableTranscript(transcript: StoredTranscript): unknown {
  return JSON.parse(JSON.stringify(transcript)) as unknown;
}
