/**
 * Drafts: what a section in flight has written so far, for the person watching the job. One
 * document per section (`jobs/{jobId}/drafts/{sectionKey}`), rewritten as the text grows; a retry
 * of the section overwrites it. Drafts are not state: nothing reads them back to resume, so they
 * are written without the owner's precondition and carry the claim's epoch, with which a reader
 * tells a zombie's late draft from the current holder's.
 */
import type { FirestoreHandle } from './firestore-handle';
import { draftPath, sectionKey } from './paths';

export interface DraftDocument {
  readonly phase: string;
  readonly unit: string | null;
  readonly id: string;
  readonly text: string;
  readonly epoch: number;
  readonly updatedAtMs: number;
}

export async function writeDraft(store: FirestoreHandle, jobId: string, draft: Omit<DraftDocument, 'updatedAtMs'>): Promise<void> {
  const document: DraftDocument = { ...draft, updatedAtMs: store.clock.now() };
  await store.db.doc(draftPath(jobId, sectionKey(draft.phase, draft.unit, draft.id))).set(document);
}
