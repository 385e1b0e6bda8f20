/** Section and transcript writes of a claim holder, each made only while it still holds its claim. */
import { OwnershipLostError } from '../../core/errors';
import { type SectionRecord } from '../../core/pipeline';
import type { ClaimSession } from '../../store/claim-session';
import { isAlreadyExists, type EventDraft } from '../../store/job-store';
import { readTranscriptDocuments } from '../../store/checkpoint-reads';
import { effectLedgerOf } from '../../store/effect-access';
import { sectionRef, transcriptRef as transcriptDocument } from '../../store/job-documents';
import { type DurableWrites } from '../context';
import type { Running, SectionOwner } from './running';

export const PROGRESS_RESETS_POISON: EventDraft = {
  kind: 'progress',
  message: 'A section was recorded after a lost worker: the job is making progress, so its lost-worker count starts again',
};

/**
 * Section and transcript writes, each made only while the writer still holds its claim: one commit
 * conditioned on the claim slot (ClaimSession), no read while the claim holds. The first section
 * recorded after a lost worker goes through an owner-checked transaction instead, because it also
 * resets the poison count on the job or unit record (see the README's quarantine rule).
 */
export function durableWrites(running: Running, owner: SectionOwner, session: ClaimSession, phase: string, unit: string | null): DurableWrites {
  const { store } = running.deps;
  const transcriptRef = (sectionId: string) => transcriptDocument(store, owner.claim.jobId, phase, unit, sectionId);
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

  /** Through the owner-checked transaction: creates the section and resets the poison count in one commit. */
  const writeSectionResettingPoison = (ref: FirebaseFirestore.DocumentReference, document: Record<string, unknown>): Promise<boolean> => {
    const create = async (tx: FirebaseFirestore.Transaction): Promise<boolean> => {
      const existing = await tx.get(ref);
      if (existing.exists) return false;
      tx.create(ref, document);
      return true;
    };
    if (owner.kind === 'job') {
      return store.asOwnerReading(owner.claim, async ({ tx, job }) => {
        const created = await create(tx);
        if (!created || job.staleReclaims === 0) return { value: created };
        return { next: { ...job, staleReclaims: 0 }, events: [PROGRESS_RESETS_POISON], value: created };
      });
    }
    return store.asUnitOwner(owner.claim, async ({ tx, unit: current }) => {
      const created = await create(tx);
      if (!created || current.staleReclaims === 0) return { value: created };
      return { nextUnit: { ...current, staleReclaims: 0 }, events: [PROGRESS_RESETS_POISON], value: created };
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
  /** This step's transcripts, by section ID: one query when the first section starts, kept in step with this holder's own saves. */
  let transcripts: Promise<Map<string, unknown>> | null = null;
  const stepTranscripts = (): Promise<Map<string, unknown>> => {
    transcripts ??= readTranscriptDocuments(store, owner.claim.jobId, phase, unit).then(
      (documents) => new Map(documents.map((document) => [String((document.data as { id?: unknown }).id), (document.data as { transcript?: unknown }).transcript ?? null])),
      (error: unknown) => {
        transcripts = null;
        throw error;
      },
    );
    return transcripts;
  };
  return {
    writeSection,
    loadTranscript: async (sectionId) => (await stepTranscripts()).get(sectionId) ?? null,
    saveTranscript: async (sectionId, transcript) => {
      await stopOnLoss(
        session.commit(`transcript ${sectionId}`, (batch) =>
          batch.set(transcriptRef(sectionId), { phase, unit, id: sectionId, transcript, epoch: owner.claim.epoch, savedAtMs: store.clock.now() }),
        ),
      );
      // The save has landed whatever the step's transcript read does: a failed read is made again at the next load.
      await transcripts?.then(
        (loaded) => loaded.set(sectionId, transcript),
        () => undefined,
      );
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
