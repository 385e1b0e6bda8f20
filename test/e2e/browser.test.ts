/**
 * The chat page in a real browser (Chromium driven by playwright-core: the one packaged in
 * @sparticuz/chromium, else the system's; see test/support/browser.ts), against the
 * emulators this layer runs under: the page is built and served from here on a free port, with a
 * /config.json that points it at them. A person's three paths: ask a question and read the report
 * as the reply (through a dropped answer that the page retries with the same Idempotency-Key),
 * answer the question a waiting job asks, and cancel a job (whose in-flight effect then shows as
 * being checked).
 *
 * The waiting and the queued job are prepared with the engine's own store (the admin SDK), as the
 * engine would leave them: no pipeline here asks a person anything, and a job the functions run
 * would race the cancel button.
 */
import { randomUUID } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { deleteApp, initializeApp, type App } from 'firebase-admin/app';
import { getFirestore, type Firestore } from 'firebase-admin/firestore';
import type { BrowserContext, Locator, Page } from 'playwright-core';
import { systemClock } from '../../functions/src/core/clock';
import type { JobRecord } from '../../functions/src/core/job';
import { resolveEngineOptions } from '../../functions/src/core/options';
import { jobIdForIdempotencyKey, JobStore } from '../../functions/src/store/job-store';
import { sectionKey } from '../../functions/src/store/paths';
import { buildWeb, serveWeb, webConfig, type WebServer } from '../../scripts/lib/local-stack';
import { REPO_ROOT } from '../../scripts/lib/stack';
import { launchTestBrowser, type LaunchedBrowser } from '../support/browser';
import { anonymousUser, E2E_PROJECT_ID, emulatorAddress, functionUrl } from '../support/emulators';

const OUTPUT_DIR = join(REPO_ROOT, 'test-output');
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

let server: WebServer;
let browser: LaunchedBrowser;
let context: BrowserContext;
let page: Page;
let userDataDir: string;
let admin: App;
let db: Firestore;
let store: JobStore;
let uid: string;
const pageProblems: string[] = [];
/** Console errors the tests cause on purpose (a dropped answer), each tolerated once. */
const causedOnPurpose: string[] = [];

jest.setTimeout(120_000);

beforeAll(async () => {
  // The page is built here, so a fresh clone's `npm test` needs no separate step.
  await buildWeb();
  const firestoreHost = process.env.FIRESTORE_EMULATOR_HOST;
  if (!firestoreHost) throw new Error('FIRESTORE_EMULATOR_HOST is not set');
  const config = webConfig({ functions: await emulatorAddress('functions'), auth: await emulatorAddress('auth'), firestore: firestoreHost }, E2E_PROJECT_ID);
  server = await serveWeb({ config, port: 0 });

  admin = initializeApp({ projectId: E2E_PROJECT_ID }, `browser-e2e-${process.pid}`);
  db = getFirestore(admin);
  store = new JobStore(db, systemClock, resolveEngineOptions());

  userDataDir = mkdtempSync(join(tmpdir(), 'phaseline-browser-profile-'));
  browser = await launchTestBrowser(userDataDir, { viewport: { width: 1200, height: 900 } });
  context = browser.context;
  page = await context.newPage();
  page.on('pageerror', (error) => pageProblems.push(`page error: ${error.message}`));
  page.on('console', (message) => {
    if (message.type() === 'error') pageProblems.push(`console error: ${message.text()}`);
  });
  await page.goto(server.url);
  await page.locator('body[data-ready="true"]').waitFor({ timeout: 30_000 });
  uid = (await page.getByTestId('who').getAttribute('data-uid')) ?? '';
  expect(uid).toMatch(/^\w{10,}$/);
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
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

async function readJob(jobId: string): Promise<JobRecord> {
  const job = await store.read(jobId);
  if (!job) throw new Error(`No job ${jobId}`);
  return job;
}

/** A research job of the page's user, written and left queued with no task: nothing runs it. */
async function queuedJob(question: string): Promise<JobRecord> {
  const created = await store.createJob({ owner: uid, pipeline: 'research', input: { question, experts: 1, sections: 1, wordsPerSection: 50 }, conversationId: null, idempotencyKey: null });
  if (!('created' in created)) throw new Error('createJob reported a conflict');
  return created.job;
}

/** Waits until the turn's status badge says exactly `status`. */
async function statusShown(turn: Locator, status: string, timeoutMs = 30_000): Promise<void> {
  await turn.locator('[data-testid="job-status"]', { hasText: new RegExp(`^${status}$`) }).waitFor({ timeout: timeoutMs });
}

async function openJob(jobId: string): Promise<Locator> {
  await page.goto(`${server.url}#job=${jobId}`);
  const turn = page.locator(`[data-testid="turn"][data-job-id="${jobId}"]`);
  await turn.waitFor();
  return turn;
}

test('asks a question: the job runs to completion and its report is the reply, through a dropped answer retried with the same key', async () => {
  const question = 'What makes long-running agent jobs resilient to crashed workers?';
  const submissions: { key: string | null; status: number; replayed: string | null }[] = [];
  // The first submission reaches submitJob, but its answer is lost on the way back: the page
  // sees a network error and must retry with the same Idempotency-Key.
  await page.route('**/submitJob', async (route) => {
    const request = route.request();
    if (request.method() !== 'POST') return route.continue();
    const key = (await request.headerValue('idempotency-key')) ?? null;
    if (submissions.length === 0) {
      const response = await route.fetch();
      submissions.push({ key, status: response.status(), replayed: response.headers()['idempotent-replayed'] ?? null });
      causedOnPurpose.push('console error: Failed to load resource: net::ERR_CONNECTION_RESET');
      return route.abort('connectionreset');
    }
    const response = await route.fetch();
    submissions.push({ key, status: response.status(), replayed: response.headers()['idempotent-replayed'] ?? null });
    return route.fulfill({ response });
  });

  await page.getByTestId('question').fill(question);
  await page.getByTestId('send').click();
  const turn = page.getByTestId('turn').last();
  await expect(turn.getByTestId('user-question').textContent()).resolves.toBe(question);
  await turn.locator('[data-testid="reply"] h1').waitFor({ timeout: 90_000 });
  await page.unroute('**/submitJob');

  // Two tries, one key (a UUID), one job: the second answer is the replay of the first.
  expect(submissions).toHaveLength(2);
  const [first, second] = submissions;
  expect(first?.status).toBe(202);
  expect(first?.key).toMatch(UUID);
  expect(second).toEqual({ key: first?.key, status: 202, replayed: 'true' });
  const jobId = jobIdForIdempotencyKey(uid, first?.key ?? '');
  await expect(turn.getAttribute('data-job-id')).resolves.toBe(jobId);
  const sameKey = await db.collection('jobs').where('owner', '==', uid).where('idempotencyKey', '==', first?.key).get();
  expect(sameKey.size).toBe(1);

  // The page shows what the job document says, and the reply is the published report.
  const job = await readJob(jobId);
  expect(job.status).toBe('completed');
  expect(job.owner).toBe(uid);
  await statusShown(turn, 'completed');
  expect(job.conversationId).toMatch(UUID);
  const message = await db.doc(`conversations/${job.conversationId ?? ''}/messages/${jobId}`).get();
  const title = String(message.get('title'));
  expect(title).toBe(`Research report: ${question}`);
  await expect(turn.locator('[data-testid="reply"] h1').textContent()).resolves.toBe(title);
  expect(await turn.locator('[data-testid="reply"] h2').count()).toBeGreaterThanOrEqual(3);
  await expect(turn.getByTestId('cost').textContent()).resolves.toMatch(/\d+ model calls · \d+ tool calls/);

  // The timeline lists every event of the job, in order, ending with the completion.
  await turn.locator('[data-testid="timeline"] li.event-completed').waitFor({ state: 'attached' });
  const events = await db.collection(`jobs/${jobId}/events`).orderBy('atMs').get();
  await turn.getByTestId('timeline').locator('summary').click();
  const kinds = await turn.locator('[data-testid="timeline"] li .kind').allTextContents();
  expect(kinds).toEqual(events.docs.map((event) => String(event.get('kind'))));
  expect(kinds[0]).toBe('submitted');
  expect(kinds.at(-1)).toBe('completed');
  await expect(turn.getByTestId('cancel').isVisible()).resolves.toBe(false);

  mkdirSync(OUTPUT_DIR, { recursive: true });
  const screenshot = join(OUTPUT_DIR, 'chat-finished-report.png');
  await turn.getByTestId('timeline').locator('summary').click(); // closed again: the report is the point
  await page.screenshot({ path: screenshot, fullPage: true });
  expect(statSync(screenshot).size).toBeGreaterThan(20_000);
});

test('answers the question a waiting job asks: the answer is recorded and the job requeued and finished', async () => {
  const queued = await queuedJob('Which storage layout suits a durable job pipeline?');
  const waiting = await store.transact(queued.id, () => null, ({ job }) =>
    Promise.resolve({
      next: { ...job, status: 'waiting' as const, waiting: { reason: 'decision' as const, questionId: 'depth', question: 'How deep should the report go?', options: ['Short overview', 'In depth'], untilMs: null } },
      events: [{ kind: 'waiting', message: 'Waiting for a decision: How deep should the report go?' }],
      value: job,
    }),
  );

  const turn = await openJob(queued.id);
  await statusShown(turn, 'waiting');
  await expect(turn.getByTestId('decision-question').textContent()).resolves.toBe('How deep should the report go?');
  const options = turn.getByTestId('decision-option');
  await expect(options.allTextContents()).resolves.toEqual(['Short overview', 'In depth']);
  await options.filter({ hasText: 'In depth' }).click();

  const decided = await until('the decision is recorded', () => readJob(queued.id), (job) => job.decisions.depth !== undefined);
  expect(decided.decisions).toEqual({ depth: 'In depth' });
  expect(decided.step).toBe(waiting.step + 1);
  expect(decided.waiting).toBeNull();
  // Requeued with a task: the functions pick it up and finish it.
  await turn.locator('[data-testid="reply"] h1').waitFor({ timeout: 90_000 });
  await statusShown(turn, 'completed');
  await expect(turn.getByTestId('waiting').isVisible()).resolves.toBe(false);
  await turn.locator('[data-testid="timeline"] li.event-completed').waitFor({ state: 'attached' });
  const kinds = await turn.locator('[data-testid="timeline"] li .kind').allTextContents();
  expect(kinds).toEqual(expect.arrayContaining(['waiting', 'decided', 'completed']));
  expect(kinds.indexOf('decided')).toBeLessThan(kinds.indexOf('completed'));
});

test('the report appears as it is written: a finished section before the job completes, the section in flight as its draft, then the published report', async () => {
  // The documents the engine writes mid-job (a running job, a recorded report section, a draft), written here as it would: nothing runs this job.
  const job = await queuedJob('How do drafts reach the chat page?');
  await db.doc(`jobs/${job.id}`).update({ status: 'running', phase: 'final-document' });
  const draftOf = (id: string) => db.doc(`jobs/${job.id}/drafts/${sectionKey('final-document', null, id)}`);
  await draftOf('h1').set({ phase: 'final-document', unit: null, id: 'h1', text: 'Leases bound how long a worker', epoch: 1, updatedAtMs: Date.now() });

  const turn = await openJob(job.id);
  await statusShown(turn, 'running');
  await turn.getByTestId('live-draft').filter({ hasText: 'Leases bound how long a worker' }).waitFor();
  await expect(turn.getByTestId('reply').isVisible()).resolves.toBe(false);

  // The first section is recorded, the second is being written: the first shows rendered, its draft gives way to the second's.
  await db.doc(`jobs/${job.id}/sections/${sectionKey('final-document', null, 'h1')}`).set({
    phase: 'final-document',
    unit: null,
    id: 'h1',
    seq: 0,
    epoch: 1,
    recordedAtMs: Date.now(),
    data: {
      headingId: 'h1',
      heading: 'Leases and <b>fencing</b>',
      text: 'Leases bound how long a worker may hold a job [1].',
      sources: [{ url: 'https://example.org/leases', title: 'Leases, a <i>paper</i>', passage: 'Leases are timed locks.', fetchedAt: '2026-12-01T00:00:00Z' }],
      missing: false,
      note: null,
    },
  });
  await draftOf('h2').set({ phase: 'final-document', unit: null, id: 'h2', text: 'Drafts are written at most once a second', epoch: 1, updatedAtMs: Date.now() });
  const section = turn.getByTestId('live-section');
  await section.locator('h2').filter({ hasText: 'Leases and <b>fencing</b>' }).waitFor();
  await expect(section.locator('b').count()).resolves.toBe(0); // model text is escaped, never markup
  // What its [1] cites, under it (the published report numbers sources across sections).
  const cited = section.getByTestId('live-sources').locator('li a');
  await expect(cited.textContent()).resolves.toBe('[1] Leases, a <i>paper</i>');
  await expect(cited.getAttribute('href')).resolves.toBe('https://example.org/leases');
  await expect(section.locator('i').count()).resolves.toBe(0);
  await turn.getByTestId('live-draft').filter({ hasText: 'Drafts are written at most once a second' }).waitFor();
  await expect(turn.getByTestId('live-draft').count()).resolves.toBe(1);
  await expect(turn.getAttribute('data-status')).resolves.toBe('running');

  // Completed and published: the report replaces the live sections and drafts.
  await db.doc(`jobs/${job.id}/results/final`).set({ title: 'Drafts', markdown: '# Drafts\n\n## Leases\n\nThe published text.', outcome: 'complete', missing: [] });
  await db.doc(`jobs/${job.id}`).update({ status: 'completed', outcome: 'complete' });
  await turn.locator('[data-testid="reply"] h1').filter({ hasText: 'Drafts' }).waitFor();
  await expect(turn.getByTestId('live-report').isVisible()).resolves.toBe(false);
});

test('cancels a queued job: the page shows it cancelled, and an effect that was in flight as being checked', async () => {
  const job = await queuedJob('How should a pipeline report effects it cannot confirm?');
  await db.doc(`jobs/${job.id}/effects/notify-team`).set({ state: 'applying', intent: 'E-mail the summary to the team', idempotencyKey: `${job.id}-notify-team` });

  const turn = await openJob(job.id);
  await statusShown(turn, 'queued');
  await expect(turn.getByTestId('checking').isVisible()).resolves.toBe(false);
  await turn.getByTestId('cancel').click();

  await statusShown(turn, 'cancelled');
  await expect(turn.getByTestId('outcome-note').textContent()).resolves.toContain('Cancelled by its owner');
  await expect(turn.getByTestId('cancel').isVisible()).resolves.toBe(false);
  await turn.getByTestId('checking').waitFor();
  await expect(turn.getByTestId('checking').textContent()).resolves.toContain('E-mail the summary to the team');

  const cancelled = await readJob(job.id);
  expect(cancelled.status).toBe('cancelled');
  expect(cancelled.cancellation?.reason).toBe('cancelled from the chat page');
  const effect = await db.doc(`jobs/${job.id}/effects/notify-team`).get();
  expect(effect.get('state')).toBe('unknown');

  await page.screenshot({ path: join(OUTPUT_DIR, 'chat-all-turns.png'), fullPage: true });
});

test('bug 7: page JavaScript on another origin reads Idempotent-Replayed and WWW-Authenticate, and no header left unexposed', async () => {
  const submitUrl = await functionUrl('submitJob');
  const pageOrigin = new URL(page.url()).origin;
  expect(new URL(submitUrl).origin).not.toBe(pageOrigin);
  const { idToken } = await anonymousUser();
  const request = { url: submitUrl, idToken, key: `bug-7-${randomUUID()}`, body: JSON.stringify({ pipeline: 'canary', input: { text: 'One paragraph for the CORS check.' } }) };

  // What reached the browser from the network, before CORS filtered it for the page.
  const firstOnTheWire = page.waitForResponse((response) => response.url() === submitUrl && response.request().method() === 'POST');
  causedOnPurpose.push('console error: Failed to load resource: the server responded with a status of 401 (Unauthorized)');
  const seenByPage = await page.evaluate(async ({ url, idToken, key, body }) => {
    const post = async (headers: Record<string, string>): Promise<{ status: number; replayed: string | null; challenge: string | null; vary: string | null }> => {
      const response = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
      return { status: response.status, replayed: response.headers.get('idempotent-replayed'), challenge: response.headers.get('www-authenticate'), vary: response.headers.get('vary') };
    };
    const withToken = { authorization: `Bearer ${idToken}`, 'idempotency-key': key };
    return { first: await post(withToken), repeat: await post(withToken), anonymous: await post({}) };
  }, request);

  expect(seenByPage.first).toMatchObject({ status: 202, replayed: null });
  expect(seenByPage.repeat).toMatchObject({ status: 202, replayed: 'true' });
  expect(seenByPage.anonymous).toMatchObject({ status: 401, challenge: expect.stringMatching(/^Bearer realm="phaseline"/) as unknown });
  // The answer did carry Vary, which is not exposed: the page not seeing it shows that this
  // browser enforces CORS, so the reads above are what a real page would get.
  await expect((await firstOnTheWire).allHeaders()).resolves.toMatchObject({ vary: 'Origin', 'access-control-allow-origin': pageOrigin });
  expect([seenByPage.first.vary, seenByPage.repeat.vary, seenByPage.anonymous.vary]).toEqual([null, null, null]);
});

test('a question past a limit: the submit is refused with a 429, and the page says which limit and when to try again', async () => {
  // A daily spend limit of 0: every submit of this user is refused until an operator raises it.
  await db.doc(`userLimits/${uid}`).set({ spendUsdPerDay: 0 });
  const answers: { status: number; retryAfter: string | null }[] = [];
  page.on('response', (response) => {
    if (response.url().endsWith('/submitJob') && response.request().method() === 'POST') answers.push({ status: response.status(), retryAfter: response.headers()['retry-after'] ?? null });
  });
  causedOnPurpose.push('console error: Failed to load resource: the server responded with a status of 429 (Too Many Requests)');
  const jobsBefore = (await db.collection('jobs').where('owner', '==', uid).get()).size;

  await page.getByTestId('question').fill('Is this question over my limit?');
  await page.getByTestId('send').click();
  const turn = page.getByTestId('turn').last();
  const panel = turn.getByTestId('limit-reached');
  await panel.waitFor();
  await expect(panel.getByTestId('limit-message').textContent()).resolves.toBe(
    'This account may not spend on model calls at the moment (its daily spend limit is $0); ask an operator to raise it.',
  );
  await expect(panel.getByTestId('limit-retry-at').textContent()).resolves.toMatch(/^You can try again at \d\d:\d\d:\d\d( [AP]M)?\.$/);
  // Not retried by the page: one answer, a 429 with Retry-After until the day's spend resets.
  expect(answers).toHaveLength(1);
  expect(answers[0]?.status).toBe(429);
  expect(Number(answers[0]?.retryAfter)).toBeGreaterThan(0);
  await expect(panel.getByTestId('retry-send').isDisabled()).resolves.toBe(true);
  expect((await db.collection('jobs').where('owner', '==', uid).get()).size).toBe(jobsBefore);
  await db.doc(`userLimits/${uid}`).delete();
});

test('a job paused at the daily spend limit: the page shows the wait; resumed, it pauses again while over the limit, and finishes once the limit is raised', async () => {
  await db.doc(`userLimits/${uid}`).set({ spendUsdPerDay: 0 });
  const queued = await queuedJob('What does a spend limit stop?');
  const resetAtMs = Date.now() + 3_600_000;
  const waitAtLimit = {
    reason: 'budget' as const,
    questionId: 'budget',
    question: "Today's model spend of $0.00 reached this account's daily limit of $0.00.",
    options: ['resume', 'cancel'],
    untilMs: resetAtMs,
  };
  const paused = await store.transact(queued.id, () => null, ({ job }) =>
    Promise.resolve({ next: { ...job, status: 'waiting' as const, waiting: waitAtLimit, nextRunAtMs: resetAtMs }, events: [{ kind: 'waiting', message: waitAtLimit.question }], value: job }),
  );

  const turn = await openJob(queued.id);
  await statusShown(turn, 'waiting');
  await expect(turn.getByTestId('budget-question').textContent()).resolves.toBe(waitAtLimit.question);
  await expect(turn.getByTestId('budget-until').textContent()).resolves.toMatch(/^It resumes by itself at .+\. Resume now if your limit was raised; it pauses again if not\.$/);
  await expect(turn.locator('button[data-testid^="budget-"]').allTextContents()).resolves.toEqual(['Resume now', 'Cancel the job']);

  // Resumed while still over the limit: the functions run the step, and its first model call is refused before it starts.
  await turn.getByTestId('budget-resume').click();
  const pausedAgain = await until('the job pauses again at its limit', () => readJob(queued.id), (job) => job.status === 'waiting' && job.step > paused.step + 1, 60_000);
  expect(pausedAgain.waiting).toMatchObject({ reason: 'budget', questionId: 'budget', options: ['resume', 'cancel'] });
  expect(pausedAgain.waiting?.question).toMatch(/^This account may not spend on model calls at the moment/);
  expect(pausedAgain.attempts).toBe(0);
  await turn.getByTestId('budget-question').filter({ hasText: 'This account may not spend on model calls' }).waitFor();

  // An operator raises the limit; resumed again, the job runs to its report.
  await db.doc(`userLimits/${uid}`).set({ spendUsdPerDay: 100 });
  await turn.getByTestId('budget-resume').click();
  await turn.locator('[data-testid="reply"] h1').waitFor({ timeout: 90_000 });
  await statusShown(turn, 'completed');
  await turn.locator('[data-testid="timeline"] li.event-completed').waitFor({ state: 'attached' });
  const kinds = await turn.locator('[data-testid="timeline"] li .kind').allTextContents();
  expect(kinds.filter((kind) => kind === 'decided')).toHaveLength(2);
  await db.doc(`userLimits/${uid}`).delete();
});

test('the page raised no errors along the way, apart from the failures caused on purpose', () => {
  const unexpected = [...pageProblems];
  for (const expected of causedOnPurpose) {
    const index = unexpected.indexOf(expected);
    expect(index).toBeGreaterThanOrEqual(0);
    unexpected.splice(index, 1);
  }
  expect(unexpected).toEqual([]);
});
