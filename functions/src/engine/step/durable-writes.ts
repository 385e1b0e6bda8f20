/** Section and transcript writes of a claim holder, each made only while it still holds its claim. */
import { OwnershipLostError } from '../../core/errors';
import { type SectionRecord } from '../../core/pipeline';
import type { ClaimHolder, DocumentWrite, EventDraft } from '../../store/door';
import { isAlreadyExists } from '../../store/job-store';
import { readSectionTranscriptDocuments, readTranscriptDocuments } from '../../store/checkpoint-reads';
import { EMPTY_LOG, encodeSave, groupBySection, loadSaves, offloadLargeContents, type SectionLogState } from '../../store/transcript-log';
import { artifactStoreOf } from '../../store/artifact-store';
import type { StoredDocument } from '../../store/checkpoint-reads';
import { effectLedgerOf } from '../../store/effect-access';
import { documentExists, sectionRef } from '../../store/job-documents';
import { type DurableWrites } from '../context';
import type { RunnerDeps } from './deps';

/** What the writes need of the claim they are made under (the claim scope is one). */
export interface DurableWritesScope {
  readonly deps: RunnerDeps;
  readonly holder: ClaimHolder;
  readonly unit: string | null;
  readonly staleReclaimsAtClaim: number;
  readonly controller: AbortController;
  /** Stops the step's model and tool calls with `reason` (a write left behind failed): the step then fails with it. */
  stopCalls?(reason: unknown): void;
}

/**
 * The writes a holder leaves behind (a section record, a final answer's save): made one after
 * another in the order they were left, while the step goes on. Every later write of the step waits
 * for them (`settled`), so the holder's writes land in the order it made them; what the step
 * reports after them (progress, notes) is let through only once they landed (`after`), and never
 * if one failed. A failure is kept: no later write is made, and `settled` rejects with it.
 */
export class WritesBehind {
  private tail: Promise<void> = Promise.resolve();
  private failure: { readonly error: unknown } | null = null;
  /** Writes and reports queued and not yet done. */
  private open = 0;

  constructor(private readonly onFailure: (error: unknown) => void) {}

  /**
   * Makes `write` once the writes left before it landed. The promise tells when it did (or rejects
   * with why it was not made); nobody needs to wait for it: every later write waits anyway.
   */
  add(write: () => Promise<unknown>): Promise<void> {
    let landed!: () => void;
    let failed!: (error: unknown) => void;
    const done = new Promise<void>((resolve, reject) => {
      landed = resolve;
      failed = reject;
    });
    // The step learns of a failure through `settled` and `onFailure`: a caller that does not wait must not make it an unhandled rejection.
    done.catch(() => undefined);
    this.queue(
      async () => {
        try {
          await write();
          landed();
        } catch (error) {
          this.failure = { error };
          failed(error);
          this.onFailure(error);
        }
      },
      () => failed((this.failure as { readonly error: unknown }).error),
    );
    return done;
  }

  /** Runs `report` once every write left so far landed: at once when none is in flight, never when one failed. */
  after(report: () => void): void {
    if (this.failure !== null) return;
    if (this.open === 0) report();
    else this.queue(() => report());
  }

  /** Resolves once every write left so far landed; rejects with the first that failed. */
  async settled(): Promise<void> {
    await this.tail;
    if (this.failure !== null) throw this.failure.error;
  }

  /** Runs `step` after everything queued before it; `skipped` instead when one of those failed. */
  private queue(step: () => void | Promise<void>, skipped: () => void = () => undefined): void {
    this.open += 1;
    this.tail = this.tail.then(async () => {
      try {
        if (this.failure === null) await step();
        else skipped();
      } finally {
        this.open -= 1;
      }
    });
  }
}

export const PROGRESS_RESETS_POISON: EventDraft = {
  kind: 'progress',
  message: 'A section was recorded after a lost worker: the job is making progress, so its lost-worker count starts again',
};

/**
 * Section and transcript writes, each made only while the writer still holds its claim: one commit
 * fenced by the claim slot (the door's `slot` owner), no read while the claim holds. The first
 * section recorded after a lost worker goes through the job's (or unit's) conditioned commit
 * instead, because it also resets the poison count on that record (see the README's quarantine rule).
 *
 * Transcripts are append-only logs (store/transcript-log.ts), read once per step when the phase
 * (or unit) has no section recorded yet, so that only sections in flight have any; once some are
 * recorded, each section's log is read on its own, so finished sections' logs are not read again.
 * A log's offloaded contents (big tool results) are fetched from the job's artifacts only for the
 * section being loaded.
 *
 * Sections, and a final answer's transcript save, are written behind the work (`WritesBehind`): the
 * step goes on (its next model call) while they commit. They are made one after another in the order
 * they were left; every later write (a transcript save, an effect's ledger move) starts after them;
 * what the step reports after them reaches the flusher once they landed (`afterWrites`); and the
 * claim scope drains them before it settles the step (`drain`). One that fails is kept: nothing left
 * after it is written, a lost claim aborts the step through the claim's signal, any other failure
 * stops the step's calls (`stopCalls`) and is the error the step settles with.
 */
export function durableWrites(scope: DurableWritesScope, phase: string, resumed: boolean): DurableWrites {
  const { store } = scope.deps;
  const { holder } = scope;
  const { jobId, epoch } = holder.claim;
  const { unit } = scope;
  const artifacts = artifactStoreOf(store);
  let poisonCountToReset = scope.staleReclaimsAtClaim > 0;
  // A write left behind that fails stops the step: a lost claim through the claim's signal (below), anything else through its calls.
  const behind = new WritesBehind((error) => {
    if (!(error instanceof OwnershipLostError)) scope.stopCalls?.(error);
  });
  const stopOnLoss = async <T>(write: Promise<T>): Promise<T> => {
    try {
      return await write;
    } catch (error) {
      if (error instanceof OwnershipLostError) scope.controller.abort(error);
      throw error;
    }
  };
  const firstWriteWins = (write: Promise<boolean>): Promise<boolean> =>
    write.catch((error: unknown) => {
      // Only this claim's own commits can create it meanwhile (any other writer's slot precondition fails): first write wins.
      if (isAlreadyExists(error)) return false;
      throw error;
    });

  /**
   * Creates the section and resets the poison count in one commit conditioned on the job (or the
   * unit and its claim slot): no transaction locks the record while the section is looked for.
   * A section that appears after the look fails the create, and the commit is decided again.
   */
  const writeSectionResettingPoison = (section: DocumentWrite & { kind: 'section' }): Promise<boolean> => {
    const ref = sectionRef(store, jobId, section.phase, section.unit, section.id);
    if (holder.kind === 'job') {
      return store.apply(holder, async ({ job }) => {
        if (await documentExists(ref)) return { value: false };
        if (job.staleReclaims === 0) return { documents: [section], value: true };
        return { next: { ...job, staleReclaims: 0 }, events: [PROGRESS_RESETS_POISON], documents: [section], value: true };
      });
    }
    return firstWriteWins(
      store.apply(holder, async ({ unit: current }) => {
        if (await documentExists(ref)) return { value: false };
        if (current.staleReclaims === 0) return { documents: [section], value: true };
        return { nextUnit: { ...current, staleReclaims: 0 }, events: [PROGRESS_RESETS_POISON], documents: [section], value: true };
      }),
    );
  };

  /** First write wins: a section is never rewritten (create-if-absent, in the owner's conditioned commit). */
  const writeSection = (record: SectionRecord): Promise<boolean> => {
    const section = { kind: 'section' as const, phase: record.phase, unit: record.unit, id: record.id, document: { ...record, epoch } };
    if (poisonCountToReset) {
      return stopOnLoss(
        writeSectionResettingPoison(section).then((created) => {
          if (created) poisonCountToReset = false;
          return created;
        }),
      );
    }
    return stopOnLoss(firstWriteWins(store.apply({ kind: 'slot', holder }, () => ({ documents: [section], value: true }))));
  };
  type LoadedLog = { transcript: unknown; state: SectionLogState };
  /** Every log of this phase (and unit), by section ID: one query, made only for a step with nothing recorded yet. */
  let stepLogs: Promise<Map<string, StoredDocument[]>> | null = null;
  const readStepLogs = (): Promise<Map<string, StoredDocument[]>> => {
    stepLogs ??= readTranscriptDocuments(store, jobId, phase, unit).then(
      (documents) => groupBySection(documents),
      (error: unknown) => {
        stepLogs = null;
        throw error;
      },
    );
    return stepLogs;
  };
  const readLog = async (sectionId: string): Promise<LoadedLog> => {
    const saves = resumed ? groupBySection(await readSectionTranscriptDocuments(store, jobId, phase, unit, sectionId)).get(sectionId) : (await readStepLogs()).get(sectionId);
    if (saves === undefined) return { transcript: null, state: EMPTY_LOG };
    return loadSaves(saves, artifacts, jobId);
  };
  /** Where each section's log stands, as this holder last read or wrote it: the next save appends to it. */
  const logStates = new Map<string, SectionLogState>();
  const saveTranscript = async (sectionId: string, transcript: unknown): Promise<void> => {
    const previous = logStates.get(sectionId) ?? (await readLog(sectionId)).state;
    // Built once from the state before this save: a retried commit writes the same save.
    const encoded = encodeSave(previous, transcript);
    // Big contents go to the job's artifacts before the conditioned commit, outside it. That is
    // safe: artifacts are content-addressed (a second put of the same bytes writes nothing), so
    // if this commit then fails or the claim is lost, what was put is an orphan no save refers
    // to, harmless, and a retry puts the same bytes under the same name.
    const document = await offloadLargeContents(encoded.document, artifacts, jobId);
    const save: DocumentWrite = {
      kind: 'transcript-save',
      phase,
      unit,
      id: sectionId,
      save: encoded.next.save,
      document: { ...document, phase, unit, id: sectionId, epoch, savedAtMs: store.clock.now() },
    };
    await stopOnLoss(store.apply({ kind: 'slot', holder }, () => ({ documents: [save], value: undefined })));
    logStates.set(sectionId, encoded.next);
  };
  return {
    writeSection: (section) => behind.add(() => writeSection(section)),
    loadTranscript: async (sectionId) => {
      const loaded = await readLog(sectionId);
      logStates.set(sectionId, loaded.state);
      return loaded.transcript;
    },
    saveTranscript: async (sectionId, transcript) => {
      // After the writes left behind: the holder's writes land in the order it made them.
      await behind.settled();
      await saveTranscript(sectionId, transcript);
    },
    saveTranscriptBehind: (sectionId, transcript) => void behind.add(() => saveTranscript(sectionId, transcript)),
    refuse: (error) => void behind.add(() => Promise.reject(error instanceof Error ? error : new Error(String(error)))),
    afterWrites: (report) => behind.after(report),
    drain: () => behind.settled(),
    effects: effectLedgerOf(store, {
      jobId,
      unit,
      epoch,
      clock: store.clock,
      signal: scope.controller.signal,
      // Through the door as the holder: a cancelled job (or a claim taken over) moves no entry and starts no new effect.
      // After the writes left behind, like every write of the holder.
      commit: async (decide) => {
        await behind.settled();
        return store.apply(holder, decide);
      },
    }),
  };
}
