/** Section and transcript writes of a claim holder, each made only while it still holds its claim. */
import { OwnershipLostError } from '../../core/errors';
import { type SectionRecord } from '../../core/pipeline';
import type { ClaimSession } from '../../store/claim-session';
import { isAlreadyExists, type EventDraft } from '../../store/job-store';
import { readSectionTranscriptDocuments, readTranscriptDocuments } from '../../store/checkpoint-reads';
import { EMPTY_LOG, encodeSave, groupBySection, loadSaves, offloadLargeContents, type SectionLogState } from '../../store/transcript-log';
import { artifactStoreOf } from '../../store/artifact-store';
import type { StoredDocument } from '../../store/checkpoint-reads';
import { effectLedgerOf } from '../../store/effect-access';
import { documentExists, sectionRef, transcriptSaveRef } from '../../store/job-documents';
import { type DurableWrites } from '../context';
import type { Running, SectionOwner } from './running';

export const PROGRESS_RESETS_POISON: EventDraft = {
  kind: 'progress',
  message: 'A section was recorded after a lost worker: the job is making progress, so its lost-worker count starts again',
};

/**
 * Section and transcript writes, each made only while the writer still holds its claim: one commit
 * conditioned on the claim slot (ClaimSession), no read while the claim holds. The first section
 * recorded after a lost worker goes through the job's (or unit's) conditioned commit instead,
 * because it also resets the poison count on that record (see the README's quarantine rule).
 *
 * Transcripts are append-only logs (store/transcript-log.ts), read once per step when the phase
 * (or unit) has no section recorded yet, so that only sections in flight have any; once some are
 * recorded, each section's log is read on its own, so finished sections' logs are not read again.
 * A log's offloaded contents (big tool results) are fetched from the job's artifacts only for the
 * section being loaded.
 */
export function durableWrites(running: Running, owner: SectionOwner, session: ClaimSession, phase: string, unit: string | null, resumed: boolean): DurableWrites {
  const { store } = running.deps;
  const { jobId } = owner.claim;
  const artifacts = artifactStoreOf(store);
  let poisonCountToReset = running.staleReclaimsAtClaim > 0;
  const stopOnLoss = async <T>(write: Promise<T>): Promise<T> => {
    try {
      return await write;
    } catch (error) {
      if (error instanceof OwnershipLostError) running.controller.abort(error);
      throw error;
    }
  };
  const asOwner = <T>(body: (context: { tx: FirebaseFirestore.Transaction }) => Promise<{ value: T }>): Promise<T> =>
    stopOnLoss(owner.kind === 'job' ? store.asOwnerReading(owner.claim, body) : store.asUnitOwner(owner.claim, body));

  /**
   * Creates the section and resets the poison count in one commit conditioned on the job (or the
   * unit and its claim slot): no transaction locks the record while the section is looked for.
   * A section that appears after the look fails the create, and the commit is decided again.
   */
  const writeSectionResettingPoison = (ref: FirebaseFirestore.DocumentReference, document: Record<string, unknown>): Promise<boolean> => {
    if (owner.kind === 'job') {
      return store.asOwner(owner.claim, async ({ tx, job }) => {
        if (await documentExists(ref)) return { value: false };
        tx.create(ref, document);
        if (job.staleReclaims === 0) return { value: true };
        return { next: { ...job, staleReclaims: 0 }, events: [PROGRESS_RESETS_POISON], value: true };
      });
    }
    return store
      .commitAsUnitOwner(owner.claim, async ({ tx, unit: current }) => {
        if (await documentExists(ref)) return { value: false };
        tx.create(ref, document);
        if (current.staleReclaims === 0) return { value: true };
        return { nextUnit: { ...current, staleReclaims: 0 }, events: [PROGRESS_RESETS_POISON], value: true };
      })
      .catch((error: unknown) => {
        // Only this claim's own commits can create it meanwhile (any other writer's slot precondition fails): first write wins.
        if (isAlreadyExists(error)) return false;
        throw error;
      });
  };

  /** First write wins: a section is never rewritten (create-if-absent, in the owner's conditioned commit). */
  const writeSection = (section: SectionRecord): Promise<boolean> => {
    const ref = sectionRef(store, owner.claim.jobId, section.phase, section.unit, section.id);
    const document = { ...section, epoch: owner.claim.epoch };
    if (poisonCountToReset) {
      return stopOnLoss(
        writeSectionResettingPoison(ref, document).then((created) => {
          if (created) poisonCountToReset = false;
          return created;
        }),
      );
    }
    return stopOnLoss(
      session.commit(`section ${section.id}`, (batch) => batch.create(ref, document)).then(
        () => true,
        (error: unknown) => {
          if (isAlreadyExists(error)) return false;
          throw error;
        },
      ),
    );
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
  return {
    writeSection,
    loadTranscript: async (sectionId) => {
      const loaded = await readLog(sectionId);
      logStates.set(sectionId, loaded.state);
      return loaded.transcript;
    },
    saveTranscript: async (sectionId, transcript) => {
      const previous = logStates.get(sectionId) ?? (await readLog(sectionId)).state;
      // Built once from the state before this save: a retried commit writes the same save.
      const encoded = encodeSave(previous, transcript);
      // Big contents go to the job's artifacts before the conditioned commit, outside it. That is
      // safe: artifacts are content-addressed (a second put of the same bytes writes nothing), so
      // if this commit then fails or the claim is lost, what was put is an orphan no save refers
      // to, harmless, and a retry puts the same bytes under the same name.
      const document = await offloadLargeContents(encoded.document, artifacts, jobId);
      await stopOnLoss(
        session.commit(`transcript ${sectionId}`, (batch) => {
          batch.set(transcriptSaveRef(store, jobId, phase, unit, sectionId, encoded.next.save), {
            ...document,
            phase,
            unit,
            id: sectionId,
            epoch: owner.claim.epoch,
            savedAtMs: store.clock.now(),
          });
        }),
      );
      logStates.set(sectionId, encoded.next);
    },
    effects: effectLedgerOf(store, {
      jobId: owner.claim.jobId,
      unit,
      epoch: owner.claim.epoch,
      clock: store.clock,
      signal: running.controller.signal,
      // Effects keep the transaction that reads the job (and unit): a cancelled job must start no new effect.
      owned: asOwner,
    }),
  };
}
