/**
 * The artifact port (store/artifact-store.ts) held in memory, for unit tests of the tools: it keeps
 * and checks content as the Firestore store does (content-addressed, hash and size verified on
 * read), but only as long as the process. Deployed functions keep artifacts in Firestore.
 */
import { ArtifactUnreadableError, bytesOf, checkArtifactBudget, sha256Hex, verifiedContent, type ArtifactRef, type ArtifactStore } from '../../store/artifact-store';

export interface MemoryArtifact extends ArtifactRef {
  readonly jobId: string;
  readonly bytes: Uint8Array;
}

export interface MemoryArtifactStore extends ArtifactStore {
  list(): readonly MemoryArtifact[];
}

export function createMemoryArtifactStore(): MemoryArtifactStore {
  const stored = new Map<string, MemoryArtifact>();
  const keyOf = (jobId: string, sha256: string) => `${jobId}/${sha256}`;
  return {
    put(jobId, content, options) {
      // Copied: the caller may reuse its buffer.
      const bytes = Uint8Array.from(bytesOf(content));
      const ref: ArtifactRef = { sha256: sha256Hex(bytes), size: bytes.byteLength, contentType: options.contentType };
      const key = keyOf(jobId, ref.sha256);
      if (stored.has(key)) return Promise.resolve({ ref, written: false });
      const jobBytes = [...stored.values()].filter((artifact) => artifact.jobId === jobId).reduce((sum, artifact) => sum + artifact.size, 0);
      try {
        checkArtifactBudget(jobId, jobBytes, ref.size, options.maxJobBytes);
      } catch (error) {
        return Promise.reject(error instanceof Error ? error : new Error(String(error)));
      }
      stored.set(key, { ...ref, jobId, bytes });
      return Promise.resolve({ ref, written: true });
    },
    get(jobId, ref) {
      const artifact = stored.get(keyOf(jobId, ref.sha256));
      if (artifact === undefined) return Promise.reject(new ArtifactUnreadableError('missing', ref.sha256, `no artifact under job ${jobId}`));
      const verified = verifiedContent(ref, [Buffer.from(artifact.bytes)]);
      return verified.ok ? Promise.resolve(verified.bytes) : Promise.reject(new ArtifactUnreadableError(verified.fault, ref.sha256, verified.detail));
    },
    list: () => [...stored.values()],
  };
}
