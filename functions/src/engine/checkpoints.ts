/**
 * Reading and writing semantic state: phase checkpoints and finished sections. Everything read is
 * validated against the pipeline's schemas; what fails is refused (and named), never trusted.
 */
import { z } from 'zod';
import type { PhaseDefinition, PipelineDefinition, SectionRecord } from '../core/pipeline';
import { readCheckpointDocuments, readSectionDocuments } from '../store/checkpoint-reads';
import type { JobStore } from '../store/job-store';

export interface LoadedCheckpoints {
  readonly states: ReadonlyMap<string, unknown>;
  /** Phases whose stored checkpoint failed validation, with why. */
  readonly refused: readonly { readonly phase: string; readonly reason: string }[];
}

const checkpointDocument = z.object({ phase: z.string(), state: z.unknown(), epoch: z.number(), recordedAtMs: z.number() });
const sectionDocument = z.object({
  id: z.string(),
  phase: z.string(),
  unit: z.string().nullable(),
  data: z.unknown(),
  seq: z.number().int().nonnegative(),
  epoch: z.number(),
  recordedAtMs: z.number(),
});

export async function loadCheckpoints(store: JobStore, jobId: string, pipeline: PipelineDefinition<unknown>): Promise<LoadedCheckpoints> {
  const documents = await readCheckpointDocuments(store, jobId);
  const states = new Map<string, unknown>();
  const refused: { phase: string; reason: string }[] = [];
  const phases = new Map(pipeline.phases.map((phase) => [phase.name, phase]));
  for (const doc of documents) {
    const phase = phases.get(doc.id);
    if (!phase) continue; // a phase the pipeline no longer has
    const envelope = checkpointDocument.safeParse(doc.data);
    const parsed = envelope.success ? phase.state.safeParse(envelope.data.state) : envelope;
    if (parsed.success) states.set(phase.name, parsed.data);
    else refused.push({ phase: phase.name, reason: z.prettifyError(parsed.error) });
  }
  return { states, refused };
}

export function checkpointDocumentFor(phase: PhaseDefinition<unknown, unknown>, state: unknown, epoch: number, nowMs: number) {
  return { phase: phase.name, state: phase.state.parse(state), epoch, recordedAtMs: nowMs };
}

export interface LoadedSections {
  readonly sections: SectionRecord[];
  readonly refused: readonly { readonly id: string; readonly reason: string }[];
}

/** The sections a phase (and unit) recorded, oldest first. */
export async function loadSections(
  store: JobStore,
  jobId: string,
  phase: PhaseDefinition<unknown, unknown>,
  unit: string | null,
): Promise<LoadedSections> {
  const documents = await readSectionDocuments(store, jobId, phase.name, unit);
  const sections: SectionRecord[] = [];
  const refused: { id: string; reason: string }[] = [];
  for (const doc of documents) {
    const envelope = sectionDocument.safeParse(doc.data);
    if (!envelope.success) {
      refused.push({ id: doc.id, reason: z.prettifyError(envelope.error) });
      continue;
    }
    if (envelope.data.unit !== unit) continue;
    const data = phase.section ? phase.section.safeParse(envelope.data.data) : { success: true as const, data: envelope.data.data };
    if (!data.success) {
      refused.push({ id: envelope.data.id, reason: z.prettifyError(data.error) });
      continue;
    }
    sections.push({ id: envelope.data.id, phase: phase.name, unit, data: data.data, seq: envelope.data.seq, recordedAtMs: envelope.data.recordedAtMs });
  }
  sections.sort((a, b) => a.seq - b.seq || a.recordedAtMs - b.recordedAtMs);
  return { sections, refused };
}
