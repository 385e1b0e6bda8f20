/**
 * Artifacts: bytes too big for the document that refers to them (a fetched page's full text, a
 * tool result over the transcript's offload threshold), kept under their job and addressed by
 * their SHA-256. A reference carries the hash and size, and every read checks both, so content
 * that went missing or changed is refused with ArtifactUnreadableError, never returned short.
 *
 * The port is two calls so that a Cloud Storage implementation (one object per hash) can stand
 * beside the Firestore one here. In Firestore an artifact is a manifest, `jobs/{jobId}/artifacts/
 * {sha256}`, and chunk documents, `jobs/{jobId}/artifactChunks/{sha256}~{index}`, each holding at
 * most CHUNK_BYTES as Bytes. A put writes the chunks in several commits and the manifest last, with
 * `create`: a reader that finds the manifest finds every chunk, and a reader that comes early finds
 * no manifest ("missing"), never part of an artifact. Content already stored is not written again.
 */
import { createHash } from 'node:crypto';
import { AggregateField, type DocumentSnapshot, type Firestore } from 'firebase-admin/firestore';
import type { Clock } from '../core/clock';
import { CorruptCheckpointError, TerminalError } from '../core/errors';
import { isAlreadyExists, type FirestoreHandle } from './firestore-handle';
import { ARTIFACTS, artifactChunkPath, artifactPath, JOBS } from './paths';

/** A stored artifact: its hash (its name), size and content type. */
export interface ArtifactRef {
  /** Hex SHA-256 of the bytes. */
  readonly sha256: string;
  readonly size: number;
  readonly contentType: string;
}

/** What a reader needs to check what it loads: the hash names the artifact, the size must agree. */
export type ArtifactCheck = Pick<ArtifactRef, 'sha256' | 'size'>;

export interface ArtifactPutOptions {
  readonly contentType: string;
  /**
   * The bytes the job's artifacts may take in all: a put of new content that would pass it throws
   * ArtifactBudgetError before anything is written (content already stored costs nothing). Puts
   * running at once each see the total before the others land, so together they may pass it by
   * their own sizes.
   */
  readonly maxJobBytes?: number;
}

/** Content-addressed storage of large outputs under a job, checked against their hash on every read. */
export interface ArtifactStore {
  /** Stores the content under the job; `written` is false when the same content was there already. */
  put(jobId: string, content: Uint8Array | string, options: ArtifactPutOptions): Promise<{ ref: ArtifactRef; written: boolean }>;
  /** The bytes, checked against the reference; throws ArtifactUnreadableError when they do not match or are gone. */
  get(jobId: string, ref: ArtifactCheck): Promise<Buffer>;
}

export type ArtifactFault = 'missing' | 'chunk_missing' | 'size_mismatch' | 'hash_mismatch' | 'malformed';

/** Stored content that does not match its reference: refused, never trusted or returned short. */
export class ArtifactUnreadableError extends CorruptCheckpointError {
  constructor(
    readonly fault: ArtifactFault,
    readonly sha256: string,
    detail: string,
  ) {
    super(`Artifact ${sha256} is unreadable (${fault}): ${detail}`);
  }
}

/** New content that would take the job's artifacts past their budget: refused, nothing written. */
export class ArtifactBudgetError extends TerminalError {
  constructor(
    readonly jobId: string,
    readonly storedBytes: number,
    readonly size: number,
    readonly maxJobBytes: number,
  ) {
    super(`An artifact of ${size} bytes would take job ${jobId}'s artifacts to ${storedBytes + size} bytes, past its budget of ${maxJobBytes}`);
  }
}

/** Throws ArtifactBudgetError when `size` more bytes do not fit the budget (if any). */
export function checkArtifactBudget(jobId: string, storedBytes: number, size: number, maxJobBytes: number | undefined): void {
  if (maxJobBytes !== undefined && storedBytes + size > maxJobBytes) throw new ArtifactBudgetError(jobId, storedBytes, size, maxJobBytes);
}

/** Well under Firestore's 1 MiB document limit, with room for the chunk's other fields. */
export const CHUNK_BYTES = 512 * 1024;
/**
 * Chunks per commit: 2 MiB a request. Production takes 10 MiB and 500 writes; the emulator refuses
 * a request over 4 MiB (its gRPC message limit), and the same commits must pass both.
 */
export const CHUNKS_PER_COMMIT = 4;

const SHA256_HEX = /^[0-9a-f]{64}$/;

export function sha256Hex(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}

export function bytesOf(content: Uint8Array | string): Buffer {
  return typeof content === 'string' ? Buffer.from(content, 'utf8') : Buffer.from(content.buffer, content.byteOffset, content.byteLength);
}

/** How many chunks `size` bytes take (an empty artifact has none). */
export function chunkCountFor(size: number, chunkBytes = CHUNK_BYTES): number {
  return Math.ceil(size / chunkBytes);
}

/** Chunk indexes in the groups that are committed together, in order. */
export function commitGroups(chunkCount: number, perCommit = CHUNKS_PER_COMMIT): number[][] {
  const groups: number[][] = [];
  for (let start = 0; start < chunkCount; start += perCommit) {
    groups.push(Array.from({ length: Math.min(perCommit, chunkCount - start) }, (_, offset) => start + offset));
  }
  return groups;
}

/** The chunks' bytes joined and checked against the reference: the bytes, or the reason to refuse them. */
export function verifiedContent(ref: ArtifactCheck, chunks: readonly Buffer[]): { ok: true; bytes: Buffer } | { ok: false; fault: ArtifactFault; detail: string } {
  const bytes = Buffer.concat(chunks);
  if (bytes.byteLength !== ref.size) return { ok: false, fault: 'size_mismatch', detail: `${bytes.byteLength} bytes stored, ${ref.size} expected` };
  const actual = sha256Hex(bytes);
  if (actual !== ref.sha256) return { ok: false, fault: 'hash_mismatch', detail: `the stored bytes hash to ${actual}` };
  return { ok: true, bytes };
}

interface Manifest {
  readonly sha256: string;
  readonly size: number;
  readonly contentType: string;
  readonly chunkCount: number;
  readonly chunkBytes: number;
  readonly createdAtMs: number;
}

function manifestOf(snapshot: DocumentSnapshot): Manifest | null {
  const data = snapshot.data();
  if (data === undefined) return null;
  const { sha256, size, contentType, chunkCount, chunkBytes, createdAtMs } = data as Record<string, unknown>;
  const counts = [size, chunkCount, chunkBytes, createdAtMs].every((value) => typeof value === 'number' && Number.isInteger(value) && value >= 0);
  if (typeof sha256 !== 'string' || typeof contentType !== 'string' || !counts) return null;
  return data as Manifest;
}

class FirestoreArtifactStore implements ArtifactStore {
  constructor(
    private readonly db: Firestore,
    private readonly clock: Clock,
  ) {}

  async put(jobId: string, content: Uint8Array | string, options: ArtifactPutOptions): Promise<{ ref: ArtifactRef; written: boolean }> {
    const bytes = bytesOf(content);
    const ref: ArtifactRef = { sha256: sha256Hex(bytes), size: bytes.byteLength, contentType: options.contentType };
    const manifestRef = this.db.doc(artifactPath(jobId, ref.sha256));
    if ((await manifestRef.get()).exists) return { ref, written: false };
    if (options.maxJobBytes !== undefined) checkArtifactBudget(jobId, await this.storedBytes(jobId), ref.size, options.maxJobBytes);
    const chunkCount = chunkCountFor(bytes.byteLength);
    for (const group of commitGroups(chunkCount)) {
      const batch = this.db.batch();
      for (const index of group) {
        // A concurrent put of the same content writes the same bytes here: `set` lets both finish.
        batch.set(this.db.doc(artifactChunkPath(jobId, ref.sha256, index)), {
          sha256: ref.sha256,
          index,
          bytes: bytes.subarray(index * CHUNK_BYTES, (index + 1) * CHUNK_BYTES),
        });
      }
      await batch.commit();
    }
    const manifest: Manifest = { ...ref, chunkCount, chunkBytes: CHUNK_BYTES, createdAtMs: this.clock.now() };
    try {
      await manifestRef.create(manifest);
    } catch (error) {
      // Another put of the same content finished first: its chunks are these bytes.
      if (isAlreadyExists(error)) return { ref, written: false };
      throw error;
    }
    return { ref, written: true };
  }

  /** The sizes of the job's manifests summed (one aggregation query): what its finished artifacts take. */
  private async storedBytes(jobId: string): Promise<number> {
    const snapshot = await this.db.collection(`${JOBS}/${jobId}/${ARTIFACTS}`).aggregate({ bytes: AggregateField.sum('size') }).get();
    return snapshot.data().bytes;
  }

  async get(jobId: string, ref: ArtifactCheck): Promise<Buffer> {
    const unreadable = (fault: ArtifactFault, detail: string) => new ArtifactUnreadableError(fault, ref.sha256, detail);
    if (!SHA256_HEX.test(ref.sha256)) throw unreadable('malformed', 'the reference does not name a SHA-256');
    const manifestSnapshot = await this.db.doc(artifactPath(jobId, ref.sha256)).get();
    if (!manifestSnapshot.exists) throw unreadable('missing', `no artifact under job ${jobId}`);
    const manifest = manifestOf(manifestSnapshot);
    if (manifest === null) throw unreadable('malformed', 'its manifest is malformed');
    if (manifest.size !== ref.size) throw unreadable('size_mismatch', `the manifest says ${manifest.size} bytes, the reference ${ref.size}`);
    const chunks: Buffer[] = [];
    for (const group of commitGroups(manifest.chunkCount)) {
      const snapshots = await this.db.getAll(...group.map((index) => this.db.doc(artifactChunkPath(jobId, ref.sha256, index))));
      for (const [offset, snapshot] of snapshots.entries()) {
        const bytes: unknown = snapshot.get('bytes');
        if (!snapshot.exists || !Buffer.isBuffer(bytes)) throw unreadable('chunk_missing', `chunk ${String(group[offset])} of ${manifest.chunkCount} is absent`);
        chunks.push(bytes);
      }
    }
    const verified = verifiedContent(ref, chunks);
    if (!verified.ok) throw unreadable(verified.fault, verified.detail);
    return verified.bytes;
  }
}

/** Artifacts (fetched pages, large outputs) under the job in Firestore, content-addressed and chunked below the document limit. */
export function firestoreArtifactStore(db: Firestore, clock: Clock): ArtifactStore {
  return new FirestoreArtifactStore(db, clock);
}

/** The artifact store on the job store's Firestore, for the engine (which does not touch Firestore itself). */
export function artifactStoreOf(store: FirestoreHandle): ArtifactStore {
  return firestoreArtifactStore(store.db, store.clock);
}
