/**
 * Runs under `firebase emulators:exec` (started by throughput.ts): signs in on the Auth emulator,
 * submits jobs over HTTP to `submitJob` with a fixed number in flight, and watches each job
 * document until it is terminal. Steps run as Cloud Tasks through the tasks emulator.
 *
 * Usage: tsx bench/scenarios/throughput-client.ts <out.json> <plan.json>
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { initializeApp } from 'firebase-admin/app';
import { getFirestore, Timestamp, type Firestore } from 'firebase-admin/firestore';
import { TERMINAL_STATUSES, type JobStatus } from '../../functions/src/core/job';
import { anonymousUser, E2E_PROJECT_ID, functionUrl } from '../../test/support/emulators';

export interface ThroughputPlan {
  readonly pipeline: string;
  readonly input: unknown;
  readonly warmupJobs: number;
  readonly levels: readonly { readonly concurrency: number; readonly jobs: number }[];
  readonly timeoutMs: number;
}

export interface ThroughputJob {
  readonly jobId: string;
  readonly status: string;
  /** Client clock: POST sent to terminal state seen. */
  readonly endToEndMs: number;
  /** The job document's createdAt to its first `claimed` event (both written by the functions). */
  readonly queuedMs: number | null;
  /** createdAt to finishedAt, as the functions recorded them. */
  readonly runMs: number | null;
}

export interface ThroughputLevel {
  readonly concurrency: number;
  readonly jobs: readonly ThroughputJob[];
  readonly elapsedMs: number;
  readonly jobsPerMinute: number;
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
const POLL_MS = 100;

async function submit(url: string, idToken: string, plan: ThroughputPlan): Promise<string> {
  const response = await fetch(url, {
    method: 'POST',
    headers: { authorization: `Bearer ${idToken}`, 'content-type': 'application/json' },
    body: JSON.stringify({ pipeline: plan.pipeline, input: plan.input }),
    signal: AbortSignal.timeout(plan.timeoutMs),
  });
  if (response.status !== 202) throw new Error(`submitJob answered ${response.status}: ${await response.text()}`);
  return ((await response.json()) as { taskId: string }).taskId;
}

async function runOne(db: Firestore, url: string, idToken: string, plan: ThroughputPlan): Promise<ThroughputJob> {
  const sentAt = Date.now();
  const jobId = await submit(url, idToken, plan);
  const deadline = sentAt + plan.timeoutMs;
  for (;;) {
    const snapshot = await db.doc(`jobs/${jobId}`).get();
    const status = snapshot.get('status') as JobStatus | undefined;
    if (status !== undefined && TERMINAL_STATUSES.has(status)) {
      const endToEndMs = Date.now() - sentAt;
      const createdAt = (snapshot.get('createdAt') as Timestamp).toMillis();
      const finishedAt = snapshot.get('finishedAt') as Timestamp | null;
      const claims = await db.collection(`jobs/${jobId}/events`).where('kind', '==', 'claimed').get();
      const firstClaim = Math.min(...claims.docs.map((doc) => doc.get('atMs') as number));
      return {
        jobId,
        status,
        endToEndMs,
        queuedMs: Number.isFinite(firstClaim) ? firstClaim - createdAt : null,
        runMs: finishedAt ? finishedAt.toMillis() - createdAt : null,
      };
    }
    if (Date.now() > deadline) return { jobId, status: `timed out (${status ?? 'unknown'})`, endToEndMs: Date.now() - sentAt, queuedMs: null, runMs: null };
    await sleep(POLL_MS);
  }
}

/** Keeps `concurrency` jobs in flight until `jobs` have finished. */
async function runLevel(db: Firestore, url: string, idToken: string, plan: ThroughputPlan, concurrency: number, jobs: number): Promise<ThroughputLevel> {
  const started = Date.now();
  const finished: ThroughputJob[] = [];
  let next = 0;
  const lane = async (): Promise<void> => {
    while (next < jobs) {
      next += 1;
      finished.push(await runOne(db, url, idToken, plan));
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, jobs) }, lane));
  const elapsedMs = Date.now() - started;
  return { concurrency, jobs: finished, elapsedMs, jobsPerMinute: jobs / (elapsedMs / 60_000) };
}

async function main(): Promise<void> {
  const [outPath, planPath] = process.argv.slice(2);
  if (!outPath || !planPath) throw new Error('usage: throughput-client.ts <out.json> <plan.json>');
  const plan = JSON.parse(readFileSync(planPath, 'utf8')) as ThroughputPlan;
  const db = getFirestore(initializeApp({ projectId: E2E_PROJECT_ID }, 'bench-throughput'));
  const user = await anonymousUser();
  const url = await functionUrl('submitJob');
  const warmup: ThroughputJob[] = [];
  for (let index = 0; index < plan.warmupJobs; index += 1) warmup.push(await runOne(db, url, user.idToken, plan));
  const levels: ThroughputLevel[] = [];
  for (const level of plan.levels) {
    levels.push(await runLevel(db, url, user.idToken, plan, level.concurrency, level.jobs));
    console.log(`bench throughput: ${level.concurrency} in flight: ${levels.at(-1)?.jobsPerMinute.toFixed(1)} jobs/min`);
  }
  writeFileSync(outPath, JSON.stringify({ warmup, levels }, null, 2));
  await db.terminate();
}

main().then(
  () => process.exit(0),
  (error: unknown) => {
    console.error(error);
    process.exit(1);
  },
);
