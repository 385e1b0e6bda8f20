/**
 * The research pipeline on the web tools, offline: the simulator searches a local SearXNG-shaped
 * server (scripts/lib/research-web.ts) and reads the hits with fetch_page, on the real engine and
 * the official Firestore emulator. The report cites the pages it fetched; a worker that dies after
 * a page's result was recorded is resumed without fetching it again, even when the page has
 * changed since. Time is the harness's manual clock; a dead worker is a model call that never
 * returns.
 */
import type { ChatMessage, ChatRequest } from '../../functions/src/agent/provider';
import { splitCitationKey } from '../../functions/src/agent/transcript';
import { FETCH_PAGE_TOOL, WEB_SEARCH_TOOL } from '../../functions/src/agent/web/toolbox';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { sweep } from '../../functions/src/engine/sweeper';
import { OFFLINE_WEB_NOTE } from '../../functions/src/providers/offline';
import { decodeJob } from '../../functions/src/store/codec';
import { JOBS, sectionKey, sectionPath } from '../../functions/src/store/paths';
import { startResearchWeb, type ResearchWeb } from '../../scripts/lib/research-web';
import { engineHarness, type EngineHarness } from '../support/engine';
import { hangForever, promptIdOf, webResearchSetup, type WebResearchSetup } from '../support/research';

let web: ResearchWeb;
let harness: EngineHarness;
let research: WebResearchSetup;

beforeAll(async () => {
  web = await startResearchWeb();
  harness = engineHarness('research-web', (firestore, clock) => {
    research = webResearchSetup(firestore.db, clock, web.url);
    return research.registry;
  });
});
beforeEach(async () => {
  research.provider.intercept = null;
  research.provider.requests.length = 0;
  research.toolbox.executed.length = 0;
  web.reset();
  harness.queue.drain();
  await harness.firestore.reset();
});
afterAll(async () => {
  await harness.firestore.close();
  await web.close();
});

const db = () => harness.firestore.db;
const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
const report = async (jobId: string) => (await db().doc(`${JOBS}/${jobId}/results/final`).get()).get('markdown') as string;
const question = { question: 'How do durable job pipelines keep long-running AI agent work from being lost or done twice?', experts: 2, sections: 2, wordsPerSection: 100 };

const executedCalls = (tool: string) => research.toolbox.executed.filter((call) => call.name === tool);
const urlArgument = (argumentsText: string) => (JSON.parse(argumentsText) as { url: string }).url;
const searchRequests = () => web.requests.filter((request) => new URL(request.path, web.url).pathname === '/search');
const pageRequestCount = () => [...web.pageFetches().values()].reduce((sum, count) => sum + count, 0);

/** The reference definitions of a report, `[n]: <url> "Title"`, parsed. */
function referencesOf(markdown: string): { number: number; url: string; title: string }[] {
  const [, references = ''] = markdown.split('\n## References\n');
  return references
    .trim()
    .split('\n')
    .map((line) => {
      const match = /^\[(\d+)\]: <([^>]+)> "([^"]+)"$/.exec(line);
      if (match?.[1] === undefined || match[2] === undefined || match[3] === undefined) throw new Error(`not a reference definition: ${line}`);
      return { number: Number(match[1]), url: match[2], title: match[3] };
    });
}

/** The fetch_page results a request shows the model: the call, and the page URL and text recorded for it. */
function fetchedPagesIn(request: ChatRequest): { callId: string; url: string; text: string }[] {
  return request.messages.flatMap((message: ChatMessage) => {
    if (message.role !== 'tool' || message.name !== FETCH_PAGE_TOOL) return [];
    const page = JSON.parse(splitCitationKey(message.content).body) as { url?: string; text?: string };
    return page.url === undefined || page.text === undefined ? [] : [{ callId: message.toolCallId, url: page.url, text: page.text }];
  });
}

async function reclaimAfterLease(): Promise<void> {
  harness.clock.advance(harness.options.leaseSeconds * 1000 + 1);
  await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
}

/** A one-shot death: `dieNow` marks it; `nextDeath()` settles when it happens from then on (never, once spent). */
function deathOnce() {
  const waiting: (() => void)[] = [];
  return {
    happened: false,
    nextDeath: () => new Promise<void>((resolve) => waiting.push(resolve)),
    dieNow() {
      this.happened = true;
      for (const resolve of waiting.splice(0)) resolve();
    },
  };
}

/** Runs queued tasks; the task whose worker died is abandoned where it stands. Returns when the queue is empty. */
async function drainSurvivingDeath(death: ReturnType<typeof deathOnce>): Promise<StepOutcome[]> {
  const outcomes: StepOutcome[] = [];
  for (let round = 0; round < 300; round += 1) {
    const next = harness.queue.tasks.shift();
    if (!next) return outcomes;
    harness.clock.advance(next.delaySeconds * 1000);
    const result = await Promise.race([runStep(harness.deps(), next.task), death.nextDeath().then(() => 'died' as const)]);
    if (result !== 'died') outcomes.push(result);
  }
  throw new Error('queue never emptied');
}

const REVISED_MARKER = 'REVISED-AFTER-THE-CRASH';
const revisedPage = (title: string) => `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${title} (revised)</title>
<meta name="description" content="${REVISED_MARKER}: this page was rewritten after the first worker read it."></head>
<body><main><article><h1>${title} (revised)</h1>
<p>${REVISED_MARKER}: this article was rewritten after the first worker had fetched it, so a fetch made now reads different text about durable job pipelines.</p>
<p>${REVISED_MARKER}: a section that cites this sentence fetched the page again instead of using the result it had recorded before the crash.</p>
</article></main></body></html>`;

test('a research job on the web tools completes offline: the report cites the local pages it fetched, under ## References', async () => {
  const jobId = await harness.submit('research', question);
  const outcomes = await harness.drain();

  expect(outcomes.at(-1)?.kind).toBe('completed');
  expect(await readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
  const markdown = await report(jobId);
  expect(markdown).toContain(OFFLINE_WEB_NOTE);
  expect(markdown).not.toContain('Missing from this report');

  // Every reference is one of the local pages, numbered 1..N, and every number is cited in the text.
  const references = referencesOf(markdown);
  expect(references.length).toBeGreaterThan(1);
  expect(references.map((reference) => reference.number)).toEqual(references.map((_reference, index) => index + 1));
  for (const reference of references) expect(web.pageUrls).toContain(reference.url);
  const [body = ''] = markdown.split('\n## References\n');
  const cited = new Set([...body.matchAll(/\[(\d+)\]/g)].map((match) => Number(match[1])));
  expect([...cited].sort((a, b) => a - b)).toEqual(references.map((reference) => reference.number));

  // Every page it cites was requested from the server, and only through fetch_page: one page
  // request per fetch_page call (no redirects here), each call run once, each search a request.
  const fetchCalls = executedCalls(FETCH_PAGE_TOOL);
  const fetchedUrls = new Set(fetchCalls.map((call) => urlArgument(call.arguments)));
  for (const reference of references) {
    expect(fetchedUrls).toContain(reference.url);
    expect(web.pageFetches().get(reference.url)).toBeGreaterThan(0);
  }
  expect(pageRequestCount()).toBe(fetchCalls.length);
  expect(searchRequests()).toHaveLength(executedCalls(WEB_SEARCH_TOOL).length);
  expect(research.toolbox.repeated()).toEqual([]);

  // The section records keep what they cite: the page URL, its title, the passage shown, when it was read.
  const finalSections = await db().collection(`${JOBS}/${jobId}/sections`).where('phase', '==', 'final-document').get();
  expect(finalSections.size).toBe(question.sections);
  for (const doc of finalSections.docs) {
    const sources = doc.get('data.sources') as { url: string; title: string; passage: string; fetchedAt: string }[];
    expect(sources.length).toBeGreaterThan(0);
    for (const source of sources) {
      expect(web.pageUrls).toContain(source.url);
      expect(source.passage.length).toBeGreaterThan(0);
      expect(source.fetchedAt).toBe(new Date(source.fetchedAt).toISOString());
    }
  }
});

test('a worker that dies after a page was fetched and recorded: the resumed section does not fetch it again, and the page changing meanwhile does not change what it cites', async () => {
  // The worker dies in the first model call of e1-h1 that follows recorded fetch_page results.
  const death = deathOnce();
  let seenAtDeath: { callId: string; url: string; text: string }[] = [];
  research.provider.intercept = (request, call) => {
    if (!death.happened && promptIdOf(request) === 'e1-h1' && request.messages.at(-1)?.role === 'tool') {
      const fetched = fetchedPagesIn(request);
      if (fetched.length > 0) {
        seenAtDeath = fetched;
        death.dieNow();
        return hangForever();
      }
    }
    return call();
  };
  const jobId = await harness.submit('research', question);
  await drainSurvivingDeath(death);
  expect(death.happened).toBe(true);
  expect(seenAtDeath.length).toBeGreaterThan(0);
  const deadCallIds = new Set(seenAtDeath.map((page) => page.callId));
  const executionsBeforeDeath = research.toolbox.executed.length;

  // Meanwhile the pages it read change on the server.
  for (const page of seenAtDeath) web.revisePage(page.url, revisedPage(page.url));
  await reclaimAfterLease();
  research.provider.intercept = null;
  await harness.drain();

  expect(await readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
  // No fetch_page call whose result was on record ran again, and no call ran twice at all.
  const afterDeath = research.toolbox.executed.slice(executionsBeforeDeath);
  expect(afterDeath.filter((call) => deadCallIds.has(call.id))).toEqual([]);
  expect(research.toolbox.repeated()).toEqual([]);
  // The server saw exactly one page request per fetch_page execution: nothing fetched outside one.
  expect(pageRequestCount()).toBe(executedCalls(FETCH_PAGE_TOOL).length);

  // The resumed section went on from the recorded results: every later request of e1-h1 shows the
  // pages as first fetched, and its record cites them with the passages read then.
  const resumed = research.provider.requests.filter((request) => promptIdOf(request) === 'e1-h1' && fetchedPagesIn(request).length > 0);
  expect(resumed.length).toBeGreaterThan(1);
  for (const request of resumed) {
    for (const page of fetchedPagesIn(request).filter((shown) => deadCallIds.has(shown.callId))) {
      expect(page.text).toBe(seenAtDeath.find((original) => original.callId === page.callId)?.text);
    }
    expect(JSON.stringify(request.messages)).not.toContain(REVISED_MARKER);
  }
  const e1h1 = (await db().doc(sectionPath(jobId, sectionKey('expert-content', 'e1', 'h1'))).get()).get('data') as { text: string; sources: { url: string }[] };
  expect(e1h1.sources.map((source) => source.url)).toEqual(expect.arrayContaining([...new Set(seenAtDeath.map((page) => page.url))]));
  expect(JSON.stringify(e1h1)).not.toContain(REVISED_MARKER);

  // The change was real: fetch_page run now reads the revised text.
  for (const page of seenAtDeath) {
    const probe = { id: `probe-${page.callId}`, name: FETCH_PAGE_TOOL, arguments: JSON.stringify({ url: page.url }) };
    expect((await research.toolbox.forJob(jobId).execute(probe, new AbortController().signal)).content).toContain(REVISED_MARKER);
  }
});
