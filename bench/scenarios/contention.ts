/**
 * Claim contention: many deliveries of step 0 arriving at once, as duplicate or concurrent task
 * dispatches would. Claimer i runs the real runner on job i mod J (a one-phase pipeline, so the
 * winner claims, runs an empty phase and hands off). Transactions are counted on the client:
 * attempts beyond one per transaction are the SDK's retries after an aborted commit.
 */
import { ManualClock, seededRandom } from '../../functions/src/core/clock';
import { stepTaskId } from '../../functions/src/core/job';
import { resolveEngineOptions } from '../../functions/src/core/options';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { JobStore } from '../../functions/src/store/job-store';
import { benchPipelines } from '../lib/bench-pipelines';
import type { ProjectClients } from '../lib/firestore';
import { VirtualTaskQueue } from '../lib/phaseline-driver';

export interface ContentionSample {
  readonly claimers: number;
  readonly jobs: number;
  readonly repeat: number;
  /** Claimers whose claim won (their step handed off). */
  readonly winners: number;
  /** The most winners any one job had (the invariant: 1). */
  readonly maxWinnersPerJob: number;
  readonly notClaimable: number;
  /** Claimers whose step threw (a write that failed after every retry). */
  readonly errors: number;
  readonly transactions: number;
  readonly transactionAttempts: number;
  /**
   * Transaction attempts beyond the fewest the outcome needed (one claim per claimer, one hand-off
   * per winner): aborted attempts the SDK ran again, and whole transactions the store retried.
   */
  readonly retriedAttempts: number;
  /** RPCs that failed with ABORTED. */
  readonly abortedRpcs: number;
  readonly settleMs: number;
}

export async function measureContention(project: ProjectClients, claimers: number, jobs: number, repeat: number): Promise<ContentionSample> {
  await project.reset();
  const clock = new ManualClock();
  const store = new JobStore(project.db, clock, resolveEngineOptions());
  const queue = new VirtualTaskQueue(clock);
  const jobIds: string[] = [];
  for (let index = 0; index < jobs; index += 1) {
    const created = await store.createJob({ owner: 'bench-user', pipeline: 'bench-noop', input: {}, conversationId: null, idempotencyKey: null });
    if (!('created' in created)) throw new Error('unexpected idempotency conflict');
    jobIds.push(created.job.id);
    await queue.enqueue({ jobId: created.job.id, step: 0 }, { id: stepTaskId(created.job.id, 0, 0) });
  }
  project.counter.reset();
  const started = performance.now();
  const results = await Promise.all(
    Array.from({ length: claimers }, (_, index) => {
      const jobId = jobIds[index % jobs] as string;
      return runStep({ store, queue, pipelines: benchPipelines, random: seededRandom(index + 1), worker: `claimer-${index}` }, { jobId, step: 0 }).then(
        (outcome): { jobId: string; outcome: StepOutcome | null } => ({ jobId, outcome }),
        (): { jobId: string; outcome: StepOutcome | null } => ({ jobId, outcome: null }),
      );
    }),
  );
  const settleMs = performance.now() - started;
  const counts = project.counter.snapshot();
  const winsPerJob = new Map<string, number>();
  for (const { jobId, outcome } of results) if (outcome?.kind === 'handed-off') winsPerJob.set(jobId, (winsPerJob.get(jobId) ?? 0) + 1);
  const winners = [...winsPerJob.values()].reduce((sum, wins) => sum + wins, 0);
  return {
    claimers,
    jobs,
    repeat,
    winners,
    maxWinnersPerJob: Math.max(0, ...winsPerJob.values()),
    notClaimable: results.filter(({ outcome }) => outcome?.kind === 'not-claimable').length,
    errors: results.filter(({ outcome }) => outcome === null).length,
    transactions: counts.transactions,
    transactionAttempts: counts.transactionAttempts,
    retriedAttempts: counts.transactionAttempts - (claimers + winners),
    abortedRpcs: counts.aborted,
    settleMs,
  };
}
