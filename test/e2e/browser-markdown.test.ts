/**
 * A hostile report in the real chat page, in real Chromium (see test/support/browser.ts): a
 * completed job whose published Markdown carries script tags, event handlers, javascript: and
 * data: links (inline, reference-style, entity-encoded) and tags that would change the page is
 * opened the way a person opens it, and nothing in it runs. The page renders it through
 * web/src/markdown.ts into innerHTML; test/unit/markdown.test.ts covers the renderer alone.
 *
 * The job is written with the admin SDK and never dispatched: nothing runs it, it only has to look
 * finished to the page.
 */
import { cpSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { deleteApp, initializeApp, type App } from 'firebase-admin/app';
import { getFirestore, type Firestore } from 'firebase-admin/firestore';
import type { Locator, Page } from 'playwright-core';
import { systemClock } from '../../functions/src/core/clock';
import { resolveEngineOptions } from '../../functions/src/core/options';
import { JobStore } from '../../functions/src/store/job-store';
import { buildWeb, serveWeb, webConfig, WEB_DIST, type WebServer } from '../../scripts/lib/local-stack';
import { launchTestBrowser, type LaunchedBrowser } from '../support/browser';
import { E2E_PROJECT_ID, emulatorAddress } from '../support/emulators';

jest.setTimeout(120_000);

/** Where the report's sources live; routed in the browser, since nothing here reaches the internet. */
const SOURCE_URL = 'https://sources.example/leases';
const PAGE_TITLE = 'Phaseline · research chat';

/** Each payload sets window.__pwned or changes document.title if it ever runs. */
const HOSTILE_REPORT = [
  '# Findings <script>window.__pwned = "heading script"</script>',
  '',
  `Leases expire when a worker dies [1]. <img src="data:," onerror="window.__pwned = 'img onerror'">`,
  '',
  '<script>window.__pwned = "script block"; document.title = "pwned"</script>',
  '',
  '<svg onload="window.__pwned = \'svg onload\'"></svg> <iframe srcdoc="<script>parent.__pwned = \'iframe\'</script>"></iframe>',
  '',
  '<details open ontoggle="window.__pwned = \'details ontoggle\'"><summary>x</summary></details>',
  '',
  '<meta http-equiv="refresh" content="0;url=javascript:window.__pwned=\'meta refresh\'"><base href="javascript:window.__pwned=\'base\'//">',
  '',
  '- [inline](javascript:window.__pwned="inline link")',
  '- [upper case](JAVASCRIPT:window.__pwned="upper case")',
  '- [entity](&#106;avascript:window.__pwned="entity")',
  '- [data](data:text/html,<script>parent.__pwned="data"</script>)',
  '- [reference][evil] and <javascript:window.__pwned="autolink">',
  '- <a href="javascript:window.__pwned=\'html link\'">html link</a>',
  '',
  '| Source | Note |',
  '|---|---|',
  `| <img src="data:," onerror="document.title='pwned'"> | [cell](javascript:document.title="pwned") |`,
  '',
  `[1]: ${SOURCE_URL} "Leases and fencing"`,
  '[evil]: javascript:window.__pwned="reference"',
].join('\n');

/** The browser globals the page functions below use: this project compiles without the DOM library. */
interface BrowserElement {
  readonly localName: string;
  readonly attributes: ArrayLike<{ readonly name: string }>;
  innerHTML: string;
  getAttribute(name: string): string | null;
  querySelectorAll(selector: string): ArrayLike<BrowserElement>;
  remove(): void;
}
declare const window: { __pwned?: unknown; __controlFired?: boolean; readonly opener: unknown };
declare const document: { readonly title: string; readonly referrer: string; readonly body: { append(node: BrowserElement): void }; createElement(tag: string): BrowserElement };
declare const location: { readonly href: string };

let server: WebServer;
let browser: LaunchedBrowser;
let page: Page;
let userDataDir: string;
let webRoot: string;
let admin: App;
let db: Firestore;
let store: JobStore;
let uid: string;
const pageErrors: string[] = [];

beforeAll(async () => {
  await buildWeb();
  // Served from a copy: another browser test rebuilding web/dist cannot pull files from under this page.
  webRoot = mkdtempSync(join(tmpdir(), 'phaseline-web-'));
  cpSync(WEB_DIST, webRoot, { recursive: true });
  const firestoreHost = process.env.FIRESTORE_EMULATOR_HOST;
  if (!firestoreHost) throw new Error('FIRESTORE_EMULATOR_HOST is not set');
  const config = webConfig({ functions: await emulatorAddress('functions'), auth: await emulatorAddress('auth'), firestore: firestoreHost }, E2E_PROJECT_ID);
  server = await serveWeb({ config, port: 0, root: webRoot });

  admin = initializeApp({ projectId: E2E_PROJECT_ID }, `browser-markdown-e2e-${process.pid}`);
  db = getFirestore(admin);
  store = new JobStore(db, systemClock, resolveEngineOptions());

  userDataDir = mkdtempSync(join(tmpdir(), 'phaseline-browser-profile-'));
  browser = await launchTestBrowser(userDataDir, { viewport: { width: 1000, height: 800 } });
  page = await browser.context.newPage();
  page.on('pageerror', (error) => pageErrors.push(error.message));
  await page.goto(server.url);
  await page.locator('body[data-ready="true"]').waitFor({ timeout: 30_000 });
  uid = (await page.getByTestId('who').getAttribute('data-uid')) ?? '';
  expect(uid).toMatch(/^\w{10,}$/);
});

afterAll(async () => {
  await browser.context.close();
  await server.close();
  await deleteApp(admin);
  rmSync(userDataDir, { recursive: true, force: true });
  rmSync(webRoot, { recursive: true, force: true });
});

/** A job of the page's user that looks finished, with `markdown` as its published report. */
async function completedJob(markdown: string): Promise<string> {
  const created = await store.createJob({ owner: uid, pipeline: 'research', input: { question: 'How do leases keep a job pipeline safe?', experts: 1, sections: 1, wordsPerSection: 50 }, conversationId: null, idempotencyKey: null });
  if (!('created' in created)) throw new Error('createJob reported a conflict');
  const jobId = created.job.id;
  await db.doc(`jobs/${jobId}/results/final`).set({ title: 'Findings', markdown, outcome: 'complete', missing: [] });
  await db.doc(`jobs/${jobId}`).update({ status: 'completed', outcome: 'complete', finishedAt: new Date() });
  return jobId;
}

async function openReply(jobId: string): Promise<Locator> {
  await page.goto(`${server.url}#job=${jobId}`);
  const reply = page.locator(`[data-testid="turn"][data-job-id="${jobId}"] [data-testid="reply"]`);
  await reply.locator('h1').waitFor({ timeout: 30_000 });
  return reply;
}

test('the page would run an event handler put into innerHTML: the check below can see one fire', async () => {
  // The control for the test after it: the same kind of payload, put into the page without the renderer, does run.
  const fired = await page.evaluate(async () => {
    const probe = document.createElement('div');
    probe.innerHTML = `<img src="data:," onerror="window.__controlFired = true">`;
    document.body.append(probe);
    await new Promise((resolve) => setTimeout(resolve, 500));
    probe.remove();
    return window.__controlFired === true;
  });
  expect(fired).toBe(true);
});

test('a report full of model-written HTML and script links runs nothing, and its citation opens with no opener and no referrer', async () => {
  const reply = await openReply(await completedJob(HOSTILE_REPORT));
  // Give handlers and refreshes the time they would need, then look.
  await page.waitForTimeout(1_000);
  const state = await page.evaluate(() => ({ pwned: window.__pwned ?? null, title: document.title, href: location.href }));
  expect(state).toEqual({ pwned: null, title: PAGE_TITLE, href: expect.stringContaining('#job=') as unknown });

  // No live element or attribute: only what Markdown builds, and only http(s) links.
  const live = await reply.evaluate((root: BrowserElement) => ({
    elements: Array.from(root.querySelectorAll('script, img, svg, iframe, details, meta, base, object, embed, form, style'), (element) => element.localName),
    handlers: Array.from(root.querySelectorAll('*')).flatMap((element) =>
      Array.from(element.attributes)
        .filter((attribute) => /^on/i.test(attribute.name))
        .map((attribute) => `${element.localName}[${attribute.name}]`),
    ),
    links: Array.from(root.querySelectorAll('a'), (link) => ({ href: link.getAttribute('href'), rel: link.getAttribute('rel'), target: link.getAttribute('target') })),
  }));
  expect(live.elements).toEqual([]);
  expect(live.handlers).toEqual([]);
  expect(live.links.length).toBeGreaterThan(0);
  for (const link of live.links) expect(link).toEqual({ href: SOURCE_URL, rel: 'noopener noreferrer', target: '_blank' });
  // The payloads are shown as text, so a reader sees what the model wrote.
  await expect(reply.textContent()).resolves.toContain('<script>window.__pwned = "script block"; document.title = "pwned"</script>');
  await expect(reply.textContent()).resolves.toContain('[inline](javascript:window.__pwned="inline link")');
  // The table and the references list rendered.
  await expect(reply.locator('table td').count()).resolves.toBe(2);
  await expect(reply.locator('ul.references li').textContent()).resolves.toBe('[1] Leases and fencing');

  // Following the citation opens the source in a new tab that cannot reach back to the page.
  await browser.context.route(`${SOURCE_URL}**`, (route) => route.fulfill({ contentType: 'text/html', body: '<title>source</title><p>Leases.</p>' }));
  const citation = reply.locator('p a.citation');
  await expect(citation.textContent()).resolves.toBe('[1]');
  const [source] = await Promise.all([browser.context.waitForEvent('page'), citation.click()]);
  await source.waitForLoadState();
  await expect(source.evaluate(() => ({ opener: window.opener, referrer: document.referrer }))).resolves.toEqual({ opener: null, referrer: '' });
  await source.close();
  expect(page.url()).toContain('#job=');

  expect(pageErrors).toEqual([]);
});
