/** What a step is given (its dependencies) and what it answers (its outcome). */
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import type { RandomSource } from '../../core/clock';
import type { Timers } from '../../core/flusher';
import type { PipelineRegistry } from '../../core/pipeline';
import { addRejectedTask } from '../../store/job-documents';
import type { JobStore } from '../../store/job-store';
import type { SpendLedger } from '../../store/quota-documents';
import type { TaskQueuePort } from '../../store/task-queue';

export interface RunnerDeps {
  readonly store: JobStore;
  /** Where the store enqueues the tasks of this step's commits (see JobStore.dispatchingTo). */
  readonly queue: TaskQueuePort;
  readonly pipelines: PipelineRegistry;
  readonly random: RandomSource;
  /** A name for people reading the lease; ownership is the epoch, never this. */
  readonly worker?: string;
  readonly timers?: Timers;
  readonly log?: (message: string, detail?: Record<string, unknown>) => void;
  /** Owners' daily spend caps; absent: the default caps, read and charged through the store's Firestore. */
  readonly spendLedger?: SpendLedger;
}

export type StepOutcome =
  | { readonly kind: 'rejected'; readonly reason: string }
  | { readonly kind: 'not-claimable'; readonly reason: string }
  | { readonly kind: 'not-yet-due'; readonly retryAfterMs: number }
  | { readonly kind: 'handed-off'; readonly phase: string; readonly checkpointed: boolean }
  | { readonly kind: 'fanned-out'; readonly phase: string; readonly units: number }
  | { readonly kind: 'unit-done'; readonly unit: string; readonly joined: boolean }
  | { readonly kind: 'unit-yielded'; readonly unit: string }
  | { readonly kind: 'completed'; readonly outcome: 'complete' | 'partial' }
  | { readonly kind: 'waiting'; readonly reason: string }
  | { readonly kind: 'requeued'; readonly attempts: number; readonly delayMs: number }
  | { readonly kind: 'failed'; readonly reason: string }
  | { readonly kind: 'ownership-lost'; readonly reason: string }
  /** No progress within the bound: the step gave its job or unit back (counted as a lost worker). */
  | { readonly kind: 'stalled'; readonly reason: string };

export const defaultWorkerName = (): string => `${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`;

/** Records a task that could not be understood (for a person) and acknowledges it to Cloud Tasks. */
export async function recordRejectedTask(deps: RunnerDeps, payload: unknown, reason: string): Promise<StepOutcome> {
  let text: string;
  try {
    text = payload === undefined ? 'undefined' : JSON.stringify(payload);
  } catch {
    text = String(payload);
  }
  deps.log?.('task rejected', { reason });
  await addRejectedTask(deps.store, { payload: text.slice(0, 10_000), reason, atMs: deps.store.clock.now() });
  return { kind: 'rejected', reason };
}
