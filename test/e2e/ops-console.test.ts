/**
 * The operator console (/ops) in a real Chromium (test/support/browser.ts), against the emulators
 * this layer runs under, its page built and served from here like the chat page's.
 *
 * The page's user signs in (anonymously, as on the chat page) without the `admin` claim: it sees a
 * plain "not an operator" message and its user ID, and the page reads nothing from Firestore. The
 * test then grants the claim with the admin SDK (what `phaseline admin grant` does); after "Check
 * again" the console shows the counts, the lists with their reasons and ages, and a quarantined job
 * of another user, opened with its timeline, units, effects and cost, every text escaped; the
 * operator releases it and watches it leave quarantine live, and the functions run it; then
 * re-drives the failed job from a chosen phase and cancels the waiting one.
 */
import { randomUUID } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { deleteApp, initializeApp, type App } from 'firebase-admin/app';
import { getFirestore, Timestamp, type Firestore } from 'firebase-admin/firestore';
import type { BrowserContext, Page } from 'playwright-core';
import { systemClock } from '../../functions/src/core/clock';
import type { JobRecord, UnitRecord } from '../../functions/src/core/job';
import { resolveEngineOptions } from '../../functions/src/core/options';
import { encodeUnit } from '../../functions/src/store/codec';
import { JobStore } from '../../functions/src/store/job-store';
import { buildWeb, serveWeb, webConfig, type WebServer } from '../../scripts/lib/local-stack';
import { REPO_ROOT } from '../../scripts/lib/stack';
import { launchTestBrowser, type LaunchedBrowser } from '../support/browser';
import { E2E_PROJECT_ID, emulatorAddress } from '../support/emulators';
import { setClaims, useAuthEmulator } from '../support/operators';

const OUTPUT_DIR = join(REPO_ROOT, 'test-output');
/** Written on every run; docs/ops-console.png (shown in the README) is a copy of it. */
const SCREENSHOT = join(OUTPUT_DIR, 'ops-console.png');
const OWNER = `ops-console-owner-${randomUUID().slice(0, 8)}`;
/** Model and tool text reaches the console; it must show as text, never as markup. */
const HOSTILE = '<img src=x onerror="document.body.dataset.owned=1">';

let server: WebServer;
let browser: LaunchedBrowser;
let context: BrowserContext;
let page: Page;
let userDataDir: string;
let admin: App;
let db: Firestore;
let store: JobStore;
let firestorePort: string;
const pageProblems: string[] = [];
const firestoreRequests: string[] = [];

jest.setTimeout(180_000);

beforeAll(async () => {
  await buildWeb();
  const firestoreHost = process.env.FIRESTORE_EMULATOR_HOST;
  if (!firestoreHost) throw new Error('FIRESTORE_EMULATOR_HOST is not set');
  firestorePort = firestoreHost.split(':')[1] ?? '';
  await useAuthEmulator();
  const config = webConfig({ functions: await emulatorAddress('functions'), auth: await emulatorAddress('auth'), firestore: firestoreHost }, E2E_PROJECT_ID);
  server = await serveWeb({ config, port: 0 });

  admin = initializeApp({ projectId: E2E_PROJECT_ID }, `ops-console-e2e-${process.pid}`);
  db = getFirestore(admin);
  store = new JobStore(db, systemClock, resolveEngineOptions());

  userDataDir = mkdtempSync(join(tmpdir(), 'phaseline-ops-profile-'));
  browser = await launchTestBrowser(userDataDir, { viewport: { width: 1400, height: 1000 } });
  context = browser.context;
  page = await context.newPage();
  page.on('pageerror', (error) => pageProblems.push(`page error: ${error.message}`));
  page.on('console', (message) => {
    if (message.type() === 'error') pageProblems.push(`console error: ${message.text()}`);
  });
  page.on('request', (request) => {
    if (new URL(request.url()).port === firestorePort) firestoreRequests.push(request.url());
  });
});

afterAll(async () => {
  await context.close();
  await server.close();
  await deleteApp(admin);
  rmSync(userDataDir, { recursive: true, force: true });
});

async function until<T>(what: string, read: () => Promise<T>, done: (value: T) => boolean, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await read();
    if (done(value)) return value;
    if (Date.now() > deadline) throw new Error(`${what}: not reached in ${timeoutMs} ms; last value ${JSON.stringify(value)}`);
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

/** A research job of OWNER's, written with no task: nothing runs it until an action enqueues one. */
async function researchJob(question: string): Promise<JobRecord> {
  const created = await store.createJob({ owner: OWNER, pipeline: 'research', input: { question, experts: 1, sections: 1, wordsPerSection: 50 }, conversationId: null, idempotencyKey: null });
  if (!('created' in created)) throw new Error('createJob reported a conflict');
  return created.job;
}

/** Moves a job as the engine would, with events on its timeline. */
function change(jobId: string, update: (job: JobRecord, nowMs: number) => JobRecord, events: { kind: string; message: string }[]): Promise<JobRecord> {
  return store.transact(jobId, () => null, ({ job }) => {
    const next = update(job, Date.now());
    return Promise.resolve({ next, events, value: next });
  });
}

/** A finished unit of an earlier fan-out, as the engine records one. */
function finishedUnit(jobId: string, unit: string, nowMs: number): UnitRecord {
  return {
    jobId,
    unit,
    phase: 'expert-content',
    fanoutEpoch: 2,
    status: 'done',
    epoch: 3,
    lease: null,
    step: 2,
    dispatch: 0,
    attempts: 0,
    staleReclaims: 0,
    nextRunAtMs: nowMs,
    progress: { sectionsDone: 1, sectionsTotal: 1 },
    cost: { modelCalls: 4 },
    costInJob: { modelCalls: 4 },
    claimTally: null,
    result: null,
    lastError: null,
    updatedAtMs: nowMs,
  };
}

interface Seeded {
  readonly quarantined: JobRecord;
  readonly failed: JobRecord;
  readonly waiting: JobRecord;
  readonly longRunning: JobRecord;
}

/** Jobs of another user in each state the console lists. */
async function seed(): Promise<Seeded> {
  const quarantinedJob = await researchJob('Which leases keep workers honest?');
  const quarantined = await change(
    quarantinedJob.id,
    (job, nowMs) => ({
      ...job,
      status: 'quarantined',
      phase: 'expert-content',
      epoch: 3,
      staleReclaims: 4,
      cost: { modelCalls: 12, toolCalls: 5, spentUsd: 0.0042 },
      quarantine: { reason: 'lost 4 workers in the same section without progress', atMs: nowMs - 7 * 60_000 },
      finishedAtMs: nowMs,
    }),
    [
      { kind: 'claimed', message: 'Claimed by worker-a (epoch 1)' },
      { kind: 'reclaimed', message: 'Reclaimed at step 1: the worker went silent' },
      { kind: 'quarantined', message: 'Quarantined: lost 4 workers in the same section without progress' },
    ],
  );
  const nowMs = Date.now();
  for (const unit of ['earlier-expert-1', 'earlier-expert-2']) await store.unitRef(quarantined.id, 'expert-content', unit).set(encodeUnit(finishedUnit(quarantined.id, unit, nowMs)));
  await db.doc(`jobs/${quarantined.id}/effects/notify-owner`).set({ state: 'applied', intent: `E-mail the owner ${HOSTILE}`, idempotencyKey: `${quarantined.id}-notify-owner` });

  const failedJob = await researchJob('What breaks a research job for good?');
  const failed = await change(
    failedJob.id,
    (job, at) => ({ ...job, status: 'failed', lastError: { code: 'provider_error', message: `The model provider answered 400: context too long ${HOSTILE}`, retryable: false, atMs: at }, finishedAtMs: at - 3 * 60_000 }),
    [{ kind: 'failed', message: 'Failed: terminal error' }],
  );
  const waitingJob = await researchJob('Which depth suits an operator?');
  const waiting = await change(
    waitingJob.id,
    (job) => ({ ...job, status: 'waiting', waiting: { reason: 'decision', questionId: 'depth', question: 'How deep should the report go?', options: ['Short', 'Deep'], untilMs: null } }),
    [{ kind: 'waiting', message: 'How deep should the report go?' }],
  );
  // Submitted two hours ago and still running (nothing runs it: no lease expires here without a sweeper).
  const longRunning = await researchJob('What takes two hours?');
  await db.doc(`jobs/${longRunning.id}`).update({ status: 'running', phase: 'perspectives', createdAt: Timestamp.fromMillis(nowMs - 2 * 3_600_000) });
  return { quarantined, failed, waiting, longRunning };
}

async function countOf(pipeline: string, status: string): Promise<number> {
  return (await db.collection('jobs').where('pipeline', '==', pipeline).where('status', '==', status).count().get()).data().count;
}

const countCell = (pipeline: string, status: string) => page.locator(`[data-testid="count"][data-pipeline="${pipeline}"][data-status="${status}"]`);
const row = (list: string, jobId: string) => page.locator(`[data-testid="list-${list}"] [data-testid="job-row"][data-job-id="${jobId}"]`);

let seeded: Seeded;
let uid: string;

test('a signed-in user without the admin claim sees a plain "not an operator" message, and the page reads nothing', async () => {
  seeded = await seed();
  await page.goto(`${server.url}ops`);
  await page.locator('body[data-ready="denied"]').waitFor({ timeout: 30_000 });
  await expect(page.getByTestId('ops-denied').textContent()).resolves.toContain('shows you nothing and you can do nothing here');
  uid = (await page.getByTestId('ops-uid').textContent()) ?? '';
  expect(uid).toMatch(/^\w{10,}$/);
  await expect(page.getByTestId('ops-console').count()).resolves.toBe(0);
  await expect(page.getByTestId('job-row').count()).resolves.toBe(0);
  await expect(page.locator('body').textContent()).resolves.not.toContain(seeded.quarantined.id);
  // Not a single request reached Firestore: a non-operator's page asks for nothing.
  expect(firestoreRequests).toEqual([]);
  mkdirSync(OUTPUT_DIR, { recursive: true });
  await page.screenshot({ path: join(OUTPUT_DIR, 'ops-not-an-operator.png') });
});

test('granted the claim, the operator sees the counts, the lists with reasons and ages, and opens a quarantined job with its timeline, units, effects and cost', async () => {
  await setClaims(admin, uid, { admin: true });
  await page.getByTestId('ops-recheck').click();
  await page.locator('body[data-ready="true"]').waitFor({ timeout: 30_000 });
  await expect(page.getByTestId('who').textContent()).resolves.toMatch(/^Operator · /);

  // The counts agree with Firestore's own count (other test files share this project).
  await until('the quarantined research count matches Firestore', async () => [await countCell('research', 'quarantined').textContent(), String(await countOf('research', 'quarantined'))], ([shown, stored]) => shown === stored);
  expect(Number(await countCell('research', 'quarantined').textContent())).toBeGreaterThanOrEqual(1);
  await expect(countCell('all', 'waiting').textContent()).resolves.toMatch(/^[1-9]\d*$/);

  // Each list holds its job, with the reason and an age.
  await row('quarantined', seeded.quarantined.id).waitFor();
  await expect(row('quarantined', seeded.quarantined.id).getByTestId('row-reason').textContent()).resolves.toBe('lost 4 workers in the same section without progress');
  await expect(row('quarantined', seeded.quarantined.id).getByTestId('row-age').textContent()).resolves.toBe('7 min');
  await expect(row('failed', seeded.failed.id).getByTestId('row-reason').textContent()).resolves.toBe(`provider_error: The model provider answered 400: context too long ${HOSTILE}`);
  await expect(row('failed', seeded.failed.id).getByTestId('row-age').textContent()).resolves.toBe('3 min');
  await expect(row('waiting', seeded.waiting.id).getByTestId('row-reason').textContent()).resolves.toBe("for its owner's decision: How deep should the report go?");
  await row('long-running', seeded.longRunning.id).waitFor();
  await expect(row('long-running', seeded.longRunning.id).getByTestId('row-age').textContent()).resolves.toMatch(/^2 h( 1 min)?$/);

  // Open the quarantined job.
  await row('quarantined', seeded.quarantined.id).locator('a').click();
  const detail = page.locator(`[data-testid="ops-job"][data-job-id="${seeded.quarantined.id}"]`);
  await detail.waitFor();
  await detail.getByTestId('ops-job-status').filter({ hasText: /^quarantined$/ }).waitFor();
  await expect(detail.getByTestId('ops-job-reason').textContent()).resolves.toBe('Quarantine reason: lost 4 workers in the same section without progress');
  await expect(detail.getByTestId('ops-job-cost').textContent()).resolves.toBe('Cost: $0.0042 spent · 12 model calls · 5 tool calls · nothing wasted');
  await expect(detail.getByTestId('ops-job-facts').textContent()).resolves.toContain(OWNER);
  const events = await db.collection(`jobs/${seeded.quarantined.id}/events`).orderBy('atMs').get();
  await until('the timeline shows every event', () => detail.locator('[data-testid="ops-timeline"] li .kind').allTextContents(), (kinds) => kinds.length === events.size);
  await expect(detail.locator('[data-testid="ops-timeline"] li .kind').allTextContents()).resolves.toEqual(events.docs.map((event) => String(event.get('kind'))));
  await expect(detail.getByTestId('ops-unit').count()).resolves.toBe(2);
  await expect(detail.locator('[data-testid="ops-effect"] td').allTextContents()).resolves.toEqual(['notify-owner', 'applied', `E-mail the owner ${HOSTILE}`]);
  // Escaped everywhere: the hostile text is text, no element came from it, and its handler never ran.
  await expect(page.locator('.ops img').count()).resolves.toBe(0);
  await expect(page.locator('body').getAttribute('data-owned')).resolves.toBeNull();
  // Only the actions that apply to a quarantined job: release and re-drive (from one of the pipeline's phases).
  await expect(detail.getByTestId('ops-release').isVisible()).resolves.toBe(true);
  await expect(detail.getByTestId('ops-cancel').isVisible()).resolves.toBe(false);
  await expect(detail.locator('[data-testid="ops-redrive-phase"] option').allTextContents()).resolves.toEqual(['outline', 'perspectives', 'expert-content', 'final-document']);

  await page.screenshot({ path: SCREENSHOT, fullPage: true });
  expect(statSync(SCREENSHOT).size).toBeGreaterThan(30_000);
});

test('the operator releases the quarantined job and watches it move live: out of the list, its status and timeline updated, the counts following', async () => {
  const detail = page.locator(`[data-testid="ops-job"][data-job-id="${seeded.quarantined.id}"]`);
  await detail.getByTestId('ops-release').click();
  await detail.getByTestId('ops-action-message').filter({ hasText: /^release: done; the job is queued\.$/ }).waitFor({ timeout: 30_000 });
  // Live from Firestore: the status leaves quarantine, the timeline gains the release, the row leaves the list.
  await detail.getByTestId('ops-job-status').filter({ hasText: /^(queued|running|completed)$/ }).waitFor({ timeout: 30_000 });
  await detail.locator('[data-testid="ops-timeline"] li.event-released').waitFor({ timeout: 30_000 });
  await row('quarantined', seeded.quarantined.id).waitFor({ state: 'detached', timeout: 30_000 });
  await until('the quarantined research count follows', async () => [await countCell('research', 'quarantined').textContent(), String(await countOf('research', 'quarantined'))], ([shown, stored]) => shown === stored);
  expect((await store.read(seeded.quarantined.id))?.status).not.toBe('quarantined');
  // The functions run it from here, and the page shows it done.
  await detail.getByTestId('ops-job-status').filter({ hasText: /^completed$/ }).waitFor({ timeout: 120_000 });
  await detail.locator('[data-testid="ops-timeline"] li.event-completed').waitFor();
});

test('the operator re-drives the failed job from a chosen phase, with a reason, and cancels the waiting one', async () => {
  await row('failed', seeded.failed.id).locator('a').click();
  const failed = page.locator(`[data-testid="ops-job"][data-job-id="${seeded.failed.id}"]`);
  await failed.getByTestId('ops-job-status').filter({ hasText: /^failed$/ }).waitFor();
  await expect(failed.getByTestId('ops-release').isVisible()).resolves.toBe(false);
  // No reason, no re-drive: the page asks for one and sends nothing.
  await failed.getByTestId('ops-redrive').click();
  await expect(failed.getByTestId('ops-action-message').textContent()).resolves.toMatch(/^Give a reason/);
  await failed.getByTestId('ops-redrive-phase').selectOption('perspectives');
  await failed.getByTestId('ops-redrive-reason').fill('the provider is fixed');
  await failed.getByTestId('ops-redrive').click();
  await failed.getByTestId('ops-action-message').filter({ hasText: /^redrive: done; the job is queued\.$/ }).waitFor({ timeout: 30_000 });
  await failed.locator('[data-testid="ops-timeline"] li.event-redriven').waitFor({ timeout: 30_000 });
  await row('failed', seeded.failed.id).waitFor({ state: 'detached', timeout: 30_000 });
  expect((await store.read(seeded.failed.id))?.redrive).toMatchObject({ fromPhase: 'perspectives', by: uid, reason: 'the provider is fixed' });

  await row('waiting', seeded.waiting.id).locator('a').click();
  const waiting = page.locator(`[data-testid="ops-job"][data-job-id="${seeded.waiting.id}"]`);
  await waiting.getByTestId('ops-job-status').filter({ hasText: /^waiting$/ }).waitFor();
  await expect(waiting.getByTestId('ops-redrive').isVisible()).resolves.toBe(false);
  await waiting.getByTestId('ops-cancel-reason').fill('nobody will answer');
  await waiting.getByTestId('ops-cancel').click();
  await waiting.getByTestId('ops-job-status').filter({ hasText: /^cancelled$/ }).waitFor({ timeout: 30_000 });
  await row('waiting', seeded.waiting.id).waitFor({ state: 'detached', timeout: 30_000 });
  expect((await store.read(seeded.waiting.id))?.cancellation).toMatchObject({ reason: 'nobody will answer', by: uid });
});

test('the page raised no errors along the way', () => {
  expect(pageProblems).toEqual([]);
});
