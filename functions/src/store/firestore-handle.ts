/**
 * The bottom floor of the store: the Firestore instance, the clock and the engine's options, the
 * references every floor above names, the retry every store write goes through, and what a
 * Firestore error's gRPC code says. Every other store module takes this handle, never JobStore;
 * JobStore is built on it (it extends the handle), so a JobStore goes wherever a handle is taken.
 */
import type { DocumentData, DocumentReference, Firestore, Precondition, SetOptions, Timestamp, UpdateData } from 'firebase-admin/firestore';
import pRetry, { AbortError } from 'p-retry';
import type { Clock } from '../core/clock';
import { CheckpointWriteError, PhaselineError } from '../core/errors';
import type { EngineOptions } from '../core/options';
import { traceCommit } from '../telemetry/commits';
import { checkpointPath, claimPath, jobPath, unitPath } from './paths';

/** gRPC codes worth retrying a write for: aborted, deadline exceeded, resource exhausted, unavailable. */
const TRANSIENT_GRPC_CODES = new Set([4, 8, 10, 14]);

export function isTransientFirestoreError(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'number' && TRANSIENT_GRPC_CODES.has(code);
}

/** gRPC ALREADY_EXISTS: a `create` found its document there. */
export function isAlreadyExists(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === 6;
}

/** gRPC FAILED_PRECONDITION: a write's update-time (or existence) precondition did not hold. */
export function isFailedPrecondition(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === 9;
}

/** The writes a commit carries: a batch's (conditioned commits) or a transaction's. */
export interface JobWriter {
  set(ref: DocumentReference, data: DocumentData, options?: SetOptions): unknown;
  create(ref: DocumentReference, data: DocumentData): unknown;
  update(ref: DocumentReference, data: UpdateData<DocumentData>, precondition?: Precondition): unknown;
  delete(ref: DocumentReference, precondition?: Precondition): unknown;
}

/** The job document as a commit is conditioned on it: its reference and the update time decided from. */
export interface JobVersion {
  readonly ref: DocumentReference;
  readonly updateTime?: Timestamp | undefined;
}

export class FirestoreHandle {
  constructor(
    readonly db: Firestore,
    readonly clock: Clock,
    readonly options: EngineOptions,
  ) {}

  jobRef(jobId: string): DocumentReference {
    return this.db.doc(jobPath(jobId));
  }

  unitRef(jobId: string, phase: string, unit: string): DocumentReference {
    return this.db.doc(unitPath(jobId, phase, unit));
  }

  claimSlotRef(jobId: string, slot: string): DocumentReference {
    return this.db.doc(claimPath(jobId, slot));
  }

  checkpointRef(jobId: string, phase: string): DocumentReference {
    return this.db.doc(checkpointPath(jobId, phase));
  }

  /** Retries transient failures; ownership and validation errors go straight through. One commit span (telemetry/commits.ts) covers the tries. */
  retryingWrite<T>(what: string, write: () => Promise<T>): Promise<T> {
    return traceCommit(what, () => retryTransient(what, write, this.options.writeRetries));
  }
}

async function retryTransient<T>(what: string, write: () => Promise<T>, retries: number): Promise<T> {
  try {
    return await pRetry(
      async () => {
        try {
          return await write();
        } catch (error) {
          if (isTransientFirestoreError(error)) throw error;
          throw new AbortError(error instanceof Error ? error : new Error(String(error)));
        }
      },
      { retries, minTimeout: 50, maxTimeout: 1_000, factor: 3, randomize: true },
    );
  } catch (error) {
    if (error instanceof PhaselineError) throw error;
    if (isTransientFirestoreError(error)) throw new CheckpointWriteError(`Writing ${what} failed after ${retries + 1} tries`, error);
    throw error;
  }
}
