/**
 * The artifact port: where a tool keeps bytes too big for its result (a fetched page's full text),
 * addressed by a reference the result carries, with the hash and size a later reader checks.
 * The in-memory sink serves tests and local runs; a Cloud Storage sink implements the same port.
 */
import { createHash } from 'node:crypto';

export interface StoredArtifact {
  /** Opaque to tools; the sink that issued it can resolve it. */
  readonly ref: string;
  /** Hex SHA-256 of the bytes. */
  readonly sha256: string;
  readonly size: number;
}

export interface ArtifactSink {
  put(name: string, bytes: Uint8Array, contentType: string): Promise<StoredArtifact>;
}

export interface MemoryArtifact extends StoredArtifact {
  readonly name: string;
  readonly contentType: string;
  readonly bytes: Uint8Array;
}

export interface MemoryArtifactSink extends ArtifactSink {
  get(ref: string): MemoryArtifact | undefined;
  list(): readonly MemoryArtifact[];
}

export function sha256Hex(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}

/** Content-addressed (the ref includes the hash), so storing the same bytes twice keeps one copy. */
export function createMemoryArtifactSink(): MemoryArtifactSink {
  const stored = new Map<string, MemoryArtifact>();
  return {
    put(name, bytes, contentType) {
      const sha256 = sha256Hex(bytes);
      const ref = `memory:${sha256}/${encodeURIComponent(name)}`;
      // Copied: the caller may reuse its buffer.
      const artifact: MemoryArtifact = { ref, sha256, size: bytes.byteLength, name, contentType, bytes: Uint8Array.from(bytes) };
      stored.set(ref, artifact);
      return Promise.resolve({ ref, sha256, size: artifact.size });
    },
    get: (ref) => stored.get(ref),
    list: () => [...stored.values()],
  };
}
