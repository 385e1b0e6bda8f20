/** Section and transcript writes of a claim holder, each made only while it still holds its claim. */
import { OwnershipLostError } from '../../core/errors';
import { type SectionRecord } from '../../core/pipeline';
import { firestoreEffectLedger } from '../../effects/firestore-ledger';
import type { EventDraft } from '../../store/job-store';
import { sectionKey, sectionPath, transcriptPath } from '../../store/paths';
import { type DurableWrites } from '../context';
import type { Running, SectionOwner } from './running';

export const PROGRESS_RESETS_POISON: EventDraft = {
  kind: 'progress',
  message: 'A section was recorded after a lost worker: the job is making progress, so its lost-worker count starts again',
};

/** Section and transcript writes, each made only while the writer still holds its claim. */
export function durableWrites(running: Running, owner: SectionOwner, phase: string, unit: string | null): DurableWrites {
  const { store } = running.deps;
  const transcriptRef = (sectionId: string) => store.db.doc(transcriptPath(owner.claim.jobId, sectionKey(phase, unit, sectionId)));
  const asOwner = async <T>(body: (context: { tx: FirebaseFirestore.Transaction }) => Promise<{ value: T }>): Promise<T> => {
    try {
      return owner.kind === 'job' ? await store.asOwner(owner.claim, body) : await store.asUnitOwner(owner.claim, body);
    } catch (error) {
      if (error instanceof OwnershipLostError) running.controller.abort(error);
      throw error;
    }
  };
  /**
   * First write wins: a section is never rewritten. A recorded section is progress, so the poison
   * count (workers lost without progress) of its owner starts again: see the README's quarantine rule.
   */
  const writeSection = async (section: SectionRecord): Promise<boolean> => {
    const ref = store.db.doc(sectionPath(owner.claim.jobId, sectionKey(section.phase, section.unit, section.id)));
    const create = async (tx: FirebaseFirestore.Transaction): Promise<boolean> => {
      const existing = await tx.get(ref);
      if (existing.exists) return false;
      tx.create(ref, { ...section, epoch: owner.claim.epoch });
      return true;
    };
    try {
      if (owner.kind === 'job') {
        return await store.asOwner(owner.claim, async ({ tx, job }) => {
          const created = await create(tx);
          if (!created || job.staleReclaims === 0) return { value: created };
          return { next: { ...job, staleReclaims: 0 }, events: [PROGRESS_RESETS_POISON], value: created };
        });
      }
      return await store.asUnitOwner(owner.claim, async ({ tx, unit: current }) => {
        const created = await create(tx);
        if (!created || current.staleReclaims === 0) return { value: created };
        return { nextUnit: { ...current, staleReclaims: 0 }, events: [PROGRESS_RESETS_POISON], value: created };
      });
    } catch (error) {
      if (error instanceof OwnershipLostError) running.controller.abort(error);
      throw error;
    }
  };
  return {
    writeSection,
    loadTranscript: async (sectionId) => {
      const snapshot = await transcriptRef(sectionId).get();
      return snapshot.exists ? (snapshot.get('transcript') as unknown) : null;
    },
    saveTranscript: (sectionId, transcript) =>
      asOwner(({ tx }) => {
        tx.set(transcriptRef(sectionId), { phase, unit, id: sectionId, transcript, epoch: owner.claim.epoch, savedAtMs: store.clock.now() });
        return Promise.resolve({ value: undefined });
      }),
    effects: firestoreEffectLedger({
      db: store.db,
      jobId: owner.claim.jobId,
      unit,
      epoch: owner.claim.epoch,
      clock: store.clock,
      signal: running.controller.signal,
      owned: asOwner,
    }),
  };
}
