/**
 * Reading and writing semantic state: phase checkpoints and finished sections. Everything read is
 * validated against the pipeline's schemas; what fails is refused (and named), never trusted.
 *
 * Versions (core/versions.ts): every checkpoint records the version of the phase that wrote it
 * (one written before versions existed reads as version 1), and is read by that rule: as written,
 * migrated, corrupt (refused and redone, as before), refused, or left for a newer worker. Refused
 * and newer state make the whole job unreadable to this worker: every state it loads is then an
 * unreadable value (below) that fails whatever reads it with the reason, and since every phase then
 * looks checkpointed, the next job step goes straight to publication, which reads them and fails
 * the job (refused: terminal, with the reason) or requeues it for a newer worker (newer: retryable,
 * a minute later). Nothing is redone, so nothing loops.
 */
import { z } from 'zod';
import { RetryableError, TerminalError, type PhaselineError } from '../core/errors';
import { resumePhaseIndex, type PhaseDefinition, type PipelineDefinition, type SectionRecord } from '../core/pipeline';
import { phaseVersion, readStored, type StoredReading } from '../core/versions';
import { readCheckpointDocuments, readSectionDocuments, type StoredDocument } from '../store/checkpoint-reads';
import type { JobStore } from '../store/job-store';
import { readPhaseSectionDocuments } from '../store/phase-documents';

/** Stored state this version of the pipeline refuses to read: the job fails with the reason (an operator may re-drive it). */
export class VersionRefusedError extends TerminalError {}

/** How long a worker of an earlier version leaves a job whose state a newer one wrote before it is tried again. */
export const NEWER_VERSION_RETRY_MS = 60_000;

/** Stored state a newer version wrote: this worker leaves it, and the step is tried again later (on a newer worker). */
export class NewerVersionError extends RetryableError {
  constructor(message: string) {
    super(message, { retryAfterMs: NEWER_VERSION_RETRY_MS });
  }
}

const unreadableReasons = new WeakMap<object, PhaselineError>();

/**
 * A stored value this worker must not use: any read of it (a property, its keys, its conversion to
 * a string or JSON, a spread) throws `error`, inside the phase or publication that reads it, where
 * the engine settles it like any error of a phase (a terminal error fails the job, a retryable one
 * requeues it). A value passed along without being read carries the refusal with it.
 */
export function unreadableValue(error: PhaselineError): object {
  const fail = (): never => {
    throw error;
  };
  const value = new Proxy(Object.create(null) as object, { get: fail, has: fail, ownKeys: fail, getOwnPropertyDescriptor: fail, set: fail, deleteProperty: fail, defineProperty: fail });
  unreadableReasons.set(value, error);
  return value;
}

/** The refusal an unreadable value carries, or null for any other value. Reads nothing of the value itself. */
export function unreadableReason(value: unknown): PhaselineError | null {
  return typeof value === 'object' && value !== null ? (unreadableReasons.get(value) ?? null) : null;
}

function refusalOf(reading: StoredReading): PhaselineError | null {
  if (reading.kind === 'refused') return new VersionRefusedError(reading.reason);
  if (reading.kind === 'newer') return new NewerVersionError(reading.reason);
  return null;
}

export interface LoadedCheckpoints {
  readonly states: ReadonlyMap<string, unknown>;
  /** Phases whose stored checkpoint failed validation, with why (empty when the job is unreadable: nothing is redone then). */
  readonly refused: readonly { readonly phase: string; readonly reason: string }[];
  /** Phases whose checkpoint an earlier version wrote and this one migrated on reading, and from which version. */
  readonly migrated: readonly { readonly phase: string; readonly from: number }[];
  /**
   * Set when the job holds state this version cannot read (refused, or written by a newer version):
   * every phase's state in `states` is then an unreadable value carrying this error.
   */
  readonly unreadable: PhaselineError | null;
}

const checkpointDocument = z.object({
  phase: z.string(),
  state: z.unknown(),
  epoch: z.number(),
  recordedAtMs: z.number(),
  /** The version of the phase that wrote it; absent on checkpoints written before versions existed (version 1). */
  version: z.number().int().positive().optional(),
});
const sectionDocument = z.object({
  id: z.string(),
  phase: z.string(),
  unit: z.string().nullable(),
  data: z.unknown(),
  seq: z.number().int().nonnegative(),
  epoch: z.number(),
  recordedAtMs: z.number(),
  /** The version of the phase that recorded it, when recorded (see core/versions.ts: unknown otherwise). */
  version: z.number().int().positive().optional(),
});

/** How a stored section's data reads under the phase's present version. */
/** The version a stored section was written by: sections record it since versions exist; one without it was recorded before, when every pipeline was at version 1. */
export function storedSectionVersion(version: number | undefined): number {
  return version ?? 1;
}

function readSection(phase: PhaseDefinition<unknown, unknown>, data: unknown, version: number | undefined): StoredReading {
  return readStored(phase, 'section', data, storedSectionVersion(version));
}

export async function loadCheckpoints(
  store: JobStore,
  jobId: string,
  pipeline: PipelineDefinition<unknown>,
  /** The checkpoint documents when the caller has read them already; the resume phase's sections are always read here, after. */
  checkpointDocuments?: Promise<readonly StoredDocument[]>,
): Promise<LoadedCheckpoints> {
  const documents = await (checkpointDocuments ?? readCheckpointDocuments(store, jobId));
  const states = new Map<string, unknown>();
  const refused: { phase: string; reason: string }[] = [];
  const migrated: { phase: string; from: number }[] = [];
  const unreadable = new Unreadable();
  const phases = new Map(pipeline.phases.map((phase) => [phase.name, phase]));
  for (const doc of documents) {
    const phase = phases.get(doc.id);
    if (!phase) continue; // a phase the pipeline no longer has
    const envelope = checkpointDocument.safeParse(doc.data);
    if (!envelope.success) {
      refused.push({ phase: phase.name, reason: z.prettifyError(envelope.error) });
      continue;
    }
    const reading = readStored(phase, 'checkpoint', envelope.data.state, envelope.data.version ?? 1);
    if (reading.kind === 'read') {
      states.set(phase.name, reading.value);
      if (reading.migratedFrom !== null) migrated.push({ phase: phase.name, from: reading.migratedFrom });
    } else if (reading.kind === 'corrupt') refused.push({ phase: phase.name, reason: reading.reason });
    else unreadable.note(refusalOf(reading));
  }
  // The phase the job resumes at may hold sections an earlier version recorded: when the phase is past
  // version 1, they are checked now, so that one it refuses (or cannot read) fails the job before any new work.
  const resumeAt = pipeline.phases[resumePhaseIndex(pipeline, new Set(states.keys()))];
  if (unreadable.error === null && resumeAt !== undefined && (phaseVersion(resumeAt) > 1 || Object.keys(resumeAt.older ?? {}).length > 0)) {
    for (const doc of await readPhaseSectionDocuments(store, jobId, resumeAt.name)) {
      const envelope = sectionDocument.safeParse(doc.data);
      if (envelope.success) unreadable.note(refusalOf(readSection(resumeAt, envelope.data.data, envelope.data.version)));
    }
  }
  const { error } = unreadable;
  if (error === null) return { states, refused, migrated, unreadable: null };
  const value = unreadableValue(error);
  return { states: new Map(pipeline.phases.map((phase) => [phase.name, value])), refused: [], migrated, unreadable: error };
}

/** The first reason a job is unreadable to this worker; a newer version's state wins over a refusal (a newer worker may read it all). */
class Unreadable {
  error: PhaselineError | null = null;

  note(error: PhaselineError | null): void {
    if (error !== null && (this.error === null || (error.retryable && !this.error.retryable))) this.error = error;
  }
}

export function checkpointDocumentFor(phase: PhaseDefinition<unknown, unknown>, state: unknown, epoch: number, nowMs: number) {
  return { phase: phase.name, state: phase.state.parse(state), epoch, recordedAtMs: nowMs, version: phaseVersion(phase) };
}

export interface LoadedSections {
  /** Readable sections, and those this version refuses (their data an unreadable value: the phase fails when it reads them, never redoes them). */
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
    const reading = readSection(phase, envelope.data.data, envelope.data.version);
    if (reading.kind === 'corrupt') {
      refused.push({ id: envelope.data.id, reason: reading.reason });
      continue;
    }
    const data = reading.kind === 'read' ? reading.value : unreadableValue(reading.kind === 'refused' ? new VersionRefusedError(reading.reason) : new NewerVersionError(reading.reason));
    sections.push({ id: envelope.data.id, phase: phase.name, unit, data, seq: envelope.data.seq, recordedAtMs: envelope.data.recordedAtMs });
  }
  sections.sort((a, b) => a.seq - b.seq || a.recordedAtMs - b.recordedAtMs);
  return { sections, refused };
}
