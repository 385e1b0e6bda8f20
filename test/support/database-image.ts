import type { CollectionReference, DocumentReference, Firestore } from 'firebase-admin/firestore';

export interface StoredDocument {
  /** Changes with every committed write to the document, even one that rewrites the same data. */
  readonly updateTime: string;
  readonly data: unknown;
}

/**
 * Every document of a test project, by path, with its update time. Two images are equal only if
 * nothing at all was written in between: the way to show that a refused write left no trace.
 */
export async function databaseImage(db: Firestore): Promise<Record<string, StoredDocument>> {
  const image: Record<string, StoredDocument> = {};
  // Siblings are read in parallel: the emulator answers each listing in its own round trip.
  const visitCollections = async (collections: readonly CollectionReference[]): Promise<void> => {
    await Promise.all(
      collections.map(async (collection) => {
        // listDocuments also names documents that only have subcollections.
        const refs = await collection.listDocuments();
        if (refs.length > 0) await visitDocuments(refs);
      }),
    );
  };
  const visitDocuments = async (refs: readonly DocumentReference[]): Promise<void> => {
    const snapshots = await db.getAll(...refs);
    for (const snapshot of snapshots) {
      if (snapshot.exists && snapshot.updateTime) {
        const { seconds, nanoseconds } = snapshot.updateTime;
        image[snapshot.ref.path] = { updateTime: `${seconds}.${String(nanoseconds).padStart(9, '0')}`, data: snapshot.data() };
      }
    }
    await Promise.all(refs.map(async (ref) => visitCollections(await ref.listCollections())));
  };
  await visitCollections(await db.listCollections());
  return Object.fromEntries(Object.entries(image).sort(([a], [b]) => a.localeCompare(b)));
}
