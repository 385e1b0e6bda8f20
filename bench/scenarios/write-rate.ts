/**
 * Writes to the job document while sections finish faster than one a second, with the real
 * flusher on real timers and the system clock (nothing injected). Every committed write is
 * logged with its time by the counting client; the job document's are picked out by path.
 */
import { ManualClock, systemClock } from '../../functions/src/core/clock';
import { resolveEngineOptions } from '../../functions/src/core/options';
import { runStep } from '../../functions/src/engine/step';
import { JobStore } from '../../functions/src/store/job-store';
import { jobPath } from '../../functions/src/store/paths';
import { benchPipelines } from '../lib/bench-pipelines';
import type { ProjectClients } from '../lib/firestore';
import { VirtualTaskQueue } from '../lib/phaseline-driver';

export interface WriteRateSample {
  readonly intervalMs: number;
  readonly repeat: number;
  readonly sections: number;
  /** Real time from the claim's commit to the hand-off's commit. */
  readonly phaseMs: number;
  readonly sectionsPerSecond: number;
  /** Every write to the job document in the step, claim and hand-off included. */
  readonly jobWrites: number;
  /** Job-document writes per second over the step. */
  readonly jobWritesPerSecond: number;
  /** The most job-document writes in any one-second window. */
  readonly maxJobWritesInOneSecond: number;
  /** Writes to the job document if every progress report were written at once (one per section, plus claim and hand-off). */
  readonly uncoalescedJobWrites: number;
  /** Job-document write times relative to the claim, ms. */
  readonly writeOffsetsMs: readonly number[];
}

export async function measureWriteRate(project: ProjectClients, intervalMs: number, sections: number, repeat: number): Promise<WriteRateSample> {
  const options = resolveEngineOptions();
  const store = new JobStore(project.db, systemClock, options);
  // Only the queue's bookkeeping uses this clock; nothing here waits on it.
  const queue = new VirtualTaskQueue(new ManualClock(0));
  const created = await store.createJob({ owner: 'bench-user', pipeline: 'bench-burst', input: { sections, intervalMs }, conversationId: null, idempotencyKey: null });
  if (!('created' in created)) throw new Error('unexpected idempotency conflict');
  const jobId = created.job.id;
  project.counter.reset();
  project.counter.recordWrites = true;
  try {
    // Step 0 claims and runs the phase with the real flusher (real timers: no `timers` override).
    const outcome = await runStep({ store, queue, pipelines: benchPipelines, random: Math.random, worker: 'bench-write-rate' }, { jobId, step: 0 });
    if (outcome.kind !== 'handed-off') throw new Error(`write-rate step ended with ${outcome.kind}`);
  } finally {
    project.counter.recordWrites = false;
  }
  const jobDoc = jobPath(jobId);
  const writes = project.counter.writeLog.filter((write) => write.path === jobDoc).map((write) => write.atMs);
  const first = writes[0] ?? 0;
  const last = writes.at(-1) ?? first;
  const phaseMs = Math.max(1, last - first);
  let maxInWindow = 0;
  for (const [index, start] of writes.entries()) {
    let count = 0;
    for (let next = index; next < writes.length && (writes[next] as number) < start + 1000; next += 1) count += 1;
    maxInWindow = Math.max(maxInWindow, count);
  }
  // Finish the job (not measured), so the project holds no half-done work.
  await runStep({ store, queue, pipelines: benchPipelines, random: Math.random, worker: 'bench-write-rate' }, { jobId, step: 1 });
  return {
    intervalMs,
    repeat,
    sections,
    phaseMs,
    sectionsPerSecond: sections / (phaseMs / 1000),
    jobWrites: writes.length,
    jobWritesPerSecond: writes.length / (phaseMs / 1000),
    maxJobWritesInOneSecond: maxInWindow,
    uncoalescedJobWrites: sections + 2,
    writeOffsetsMs: writes.map((at) => Math.round(at - first)),
  };
}
