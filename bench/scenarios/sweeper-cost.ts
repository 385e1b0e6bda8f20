/**
 * What one sweep costs with many jobs of which a few have expired leases. Jobs are seeded with
 * batched writes on the uncounted client; each measured sweep first gets its expired leases back
 * (the previous sweep reclaimed them), then runs on the counted client.
 *
 * The emulator does not use indexes (it scans), so its time per sweep is not what production
 * would see; the documents read are what the index-backed queries return, which is what matters.
 */
import type { Firestore } from 'firebase-admin/firestore';
import { ManualClock } from '../../functions/src/core/clock';
import { newQueuedJob, type JobRecord, type JobStatus } from '../../functions/src/core/job';
import { resolveEngineOptions } from '../../functions/src/core/options';
import { sweep } from '../../functions/src/engine/sweeper';
import { encodeJob } from '../../functions/src/store/codec';
import { JobStore } from '../../functions/src/store/job-store';
import { jobPath } from '../../functions/src/store/paths';
import { billedReads } from '../lib/counting';
import type { ProjectClients } from '../lib/firestore';
import { VirtualTaskQueue } from '../lib/phaseline-driver';

export interface SweeperSample {
  readonly totalJobs: number;
  readonly expired: number;
  readonly repeat: number;
  readonly ms: number;
  /** The sweeper's own count: query results plus documents read in its transactions. */
  readonly documentsRead: number;
  /** Reads as billed, counted on the wire (documents plus one per empty query). */
  readonly billedReads: number;
  readonly writes: number;
  readonly reclaimed: number;
  readonly queryDocuments: number;
}

const NOW_MS = Date.UTC(2026, 5, 1, 12, 0, 0);
const BATCH = 500;

function jobRecord(id: string, status: JobStatus, index: number): JobRecord {
  const request = { id, owner: `user-${index % 97}`, pipeline: 'research', input: { question: `Seeded job ${index}`, experts: 2, sections: 3, wordsPerSection: 80 }, conversationId: null, idempotencyKey: null };
  const base: JobRecord = { ...newQueuedJob(request, NOW_MS - 7_200_000), status, epoch: 1, step: 1, nextRunAtMs: NOW_MS - 3_600_000, updatedAtMs: NOW_MS - 60_000 };
  switch (status) {
    case 'running':
      return { ...base, lease: { epoch: 1, worker: 'seeded', expiresAtMs: NOW_MS + 120_000 } };
    case 'queued':
      return { ...base, nextRunAtMs: NOW_MS - 10_000 }; // due, but well inside the lost-task grace
    case 'waiting':
      return { ...base, waiting: { reason: 'decision', questionId: 'q1', question: 'Which way?', options: ['a', 'b'], untilMs: null } };
    default:
      return { ...base, outcome: 'complete', finishedAtMs: NOW_MS - 600_000 };
  }
}

/** Live jobs in the mix: 5 % running with a live lease, 5 % queued, 2 % waiting for a person; the rest completed. */
function statusOf(index: number): JobStatus {
  const slot = index % 100;
  if (slot < 5) return 'running';
  if (slot < 10) return 'queued';
  if (slot < 12) return 'waiting';
  return 'completed';
}

const expiredId = (index: number): string => `expired-${String(index).padStart(3, '0')}`;

function expiredRecord(index: number): JobRecord {
  const record = jobRecord(expiredId(index), 'running', index);
  return { ...record, lease: { epoch: 1, worker: 'dead-worker', expiresAtMs: NOW_MS - 600_000 } };
}

export async function seedJobs(db: Firestore, total: number, expired: number): Promise<void> {
  const ids: { id: string; record: JobRecord }[] = [];
  for (let index = 0; index < total - expired; index += 1) {
    const id = `seeded-${String(index).padStart(6, '0')}`;
    ids.push({ id, record: jobRecord(id, statusOf(index), index) });
  }
  for (let index = 0; index < expired; index += 1) ids.push({ id: expiredId(index), record: expiredRecord(index) });
  for (let start = 0; start < ids.length; start += BATCH) {
    const batch = db.batch();
    for (const { id, record } of ids.slice(start, start + BATCH)) batch.set(db.doc(jobPath(id)), encodeJob(record));
    await batch.commit();
  }
}

async function restoreExpired(db: Firestore, expired: number): Promise<void> {
  const batch = db.batch();
  for (let index = 0; index < expired; index += 1) batch.set(db.doc(jobPath(expiredId(index))), encodeJob(expiredRecord(index)));
  await batch.commit();
}

export interface SweeperMeasurement {
  readonly samples: readonly SweeperSample[];
  /** Reads of the query a sweeper without the range index would run: every running job, filtered in code. */
  readonly equalityOnlyReads: number;
}

export async function measureSweeps(project: ProjectClients, totalJobs: number, expired: number, repeats: number): Promise<SweeperMeasurement> {
  await project.reset();
  await seedJobs(project.inspector, totalJobs, expired);
  const clock = new ManualClock(NOW_MS);
  const store = new JobStore(project.db, clock, resolveEngineOptions());
  const samples: SweeperSample[] = [];
  for (let repeat = 0; repeat < repeats; repeat += 1) {
    await restoreExpired(project.inspector, expired);
    project.counter.reset();
    const queue = new VirtualTaskQueue(clock);
    const started = performance.now();
    const report = await sweep({ store, queue, log: () => undefined }, NOW_MS);
    const ms = performance.now() - started;
    const counts = project.counter.snapshot();
    samples.push({
      totalJobs,
      expired,
      repeat,
      ms,
      documentsRead: report.documentsRead,
      billedReads: billedReads(counts),
      writes: counts.writes,
      reclaimed: report.reclaimed,
      queryDocuments: report.queryDocuments,
    });
  }
  await restoreExpired(project.inspector, expired);
  project.counter.reset();
  await project.db.collection('jobs').where('status', '==', 'running').get();
  return { samples, equalityOnlyReads: billedReads(project.counter.snapshot()) };
}
