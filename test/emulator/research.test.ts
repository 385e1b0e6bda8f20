import { MalformedResponseError } from '../../functions/src/agent/provider';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { sweep } from '../../functions/src/engine/sweeper';
import { decodeJob } from '../../functions/src/store/codec';
import { JOBS } from '../../functions/src/store/paths';
import { engineSuite, engineHarness, type EngineHarness } from '../support/engine';
import { hangForever, promptIdOf, researchSetup, type ResearchSetup } from '../support/research';

let research: ResearchSetup;
const waveStartMs = Date.UTC(2026, 0, 1); // the harness clock's start

const harness = engineSuite(
  'research',
  (firestore, clock) => {
    research = researchSetup(firestore.db, clock, { epochMs: waveStartMs });
    return research.registry;
  },
  {
    beforeEach: () => {
      research.provider.intercept = null;
      research.provider.requests.length = 0;
    },
  },
);

const db = () => harness.firestore.db;
const readJob = (jobId: string) => harness.readJob(jobId);
const report = async (jobId: string) => (await db().doc(`${JOBS}/${jobId}/results/final`).get()).get('markdown') as string;
const question = { question: 'How do leases and fencing tokens keep stale workers from corrupting results?', experts: 2, sections: 2, wordsPerSection: 60 };

/**
 * Runs queued tasks; a task whose worker "dies" (its provider call never returns) is abandoned
 * where it stands, as a killed process would be. Returns when the queue is empty.
 */
async function drainSurvivingCrashes(crashed: { nextCrash: () => Promise<void> }): Promise<StepOutcome[]> {
  const outcomes: StepOutcome[] = [];
  for (let round = 0; round < 300; round += 1) {
    const next = harness.queue.tasks.shift();
    if (!next) return outcomes;
    harness.clock.advance(next.delaySeconds * 1000);
    const result = await Promise.race([runStep(harness.deps(), next.task), crashed.nextCrash().then(() => 'crashed' as const)]);
    if (result !== 'crashed') outcomes.push(result);
  }
  throw new Error('queue never emptied');
}

/** A one-shot crash: the first request matching `where` never returns (the worker is gone). */
function crashOnce(where: (promptId: string, lastRole: string) => boolean) {
  const waiting: (() => void)[] = [];
  const crashed = {
    happened: false,
    at: '',
    /** Settles when a crash happens from now on (never, once the one crash is spent). */
    nextCrash: () => new Promise<void>((resolve) => waiting.push(resolve)),
  };
  const signal = () => {
    for (const resolve of waiting.splice(0)) resolve();
  };
  research.provider.intercept = (request, call) => {
    const promptId = promptIdOf(request);
    if (!crashed.happened && where(promptId, request.messages.at(-1)?.role ?? '')) {
      crashed.happened = true;
      crashed.at = `${promptId}@${request.messages.length}`;
      signal();
      return hangForever();
    }
    return call();
  };
  return crashed;
}

async function reclaimAfterLease(): Promise<void> {
  harness.clock.advance(harness.options.leaseSeconds * 1000 + 1);
  await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
}

test('a research job completes offline: every section in the report, spent cost on the job document', async () => {
  const jobId = await harness.submit('research', question);
  const outcomes = await harness.drain();

  expect(outcomes.at(-1)?.kind).toBe('completed');
  const job = await readJob(jobId);
  expect(job).toMatchObject({ status: 'completed', outcome: 'complete' });
  expect(job.cost.modelCalls).toBeGreaterThan(8);
  expect(job.cost.toolCalls).toBeGreaterThan(4);
  expect(job.cost.spentUsd).toBeGreaterThan(0);
  expect(job.cost.wastedModelCalls).toBe(0);
  const markdown = await report(jobId);
  expect(markdown.match(/^## /gm)).toHaveLength(3);
  expect(markdown).toContain('Offline simulator');
  expect(markdown).not.toContain('Missing from this report');
  expect((await db().collection(`${JOBS}/${jobId}/sections`).where('phase', '==', 'expert-content').get()).size).toBe(4);

  // Citations: the sections cite [n], the report ends with one definition per number, 1..N, each a corpus URL.
  const [body = '', references = ''] = markdown.split('\n## References\n');
  const definitions = references.trim().split('\n');
  expect(definitions.length).toBeGreaterThan(1);
  definitions.forEach((line, index) => expect(line).toMatch(new RegExp(`^\\[${index + 1}\\]: <https://corpus\\.phaseline\\.invalid/[a-z0-9-]+> "[^"\\n]+"$`)));
  const cited = new Set([...body.matchAll(/\[(\d+)\]/g)].map((match) => Number(match[1])));
  expect([...cited].sort((a, b) => a - b)).toEqual(definitions.map((_line, index) => index + 1));
  // Each section record keeps what it cites: URL, title, the passage shown, when it was read.
  const finalSections = await db().collection(`${JOBS}/${jobId}/sections`).where('phase', '==', 'final-document').get();
  for (const doc of finalSections.docs) {
    const sources = doc.get('data.sources') as { url: string; title: string; passage: string; fetchedAt: string }[];
    expect(sources.length).toBeGreaterThan(0);
    for (const source of sources) {
      expect(source).toEqual({ url: expect.stringMatching(/^https:\/\/corpus\.phaseline\.invalid\//) as unknown, title: expect.any(String) as unknown, passage: expect.any(String) as unknown, fetchedAt: expect.any(String) as unknown });
      expect(source.passage.length).toBeGreaterThan(0);
    }
  }
});

test('fault 1: a worker killed right after a tool returns: the resumed section does not call that tool again', async () => {
  const before = { ...research.toolbox.stats().byCallId };
  const crashed = crashOnce((promptId, lastRole) => promptId === 'e1-h1' && lastRole === 'tool');
  const jobId = await harness.submit('research', question);
  await drainSurvivingCrashes(crashed);
  expect(crashed.happened).toBe(true);
  expect((await readJob(jobId)).status).toBe('running'); // waiting on the dead unit

  await reclaimAfterLease();
  research.provider.intercept = null;
  await harness.drain();

  expect((await readJob(jobId)).status).toBe('completed');
  // Executions during this test only (the toolbox is shared across the file's tests).
  const executions = Object.entries(research.toolbox.stats().byCallId).map(([id, count]) => [id, count - (before[id] ?? 0)] as const);
  expect(executions.filter(([, count]) => count > 0).length).toBeGreaterThan(4);
  expect(executions.filter(([, count]) => count > 1)).toEqual([]);
  // The only request made twice is the model call the worker died in.
  expect(research.provider.repeatedRequests()).toEqual([crashed.at]);
  // The resumed section kept the sources of the results recorded before the crash: it cites them.
  const expertSections = await db().collection(`${JOBS}/${jobId}/sections`).where('phase', '==', 'expert-content').get();
  expect(expertSections.docs.map((doc) => (doc.get('data.sources') as unknown[]).length > 0)).toEqual(expertSections.docs.map(() => true));
  expect(await report(jobId)).toMatch(/\n## References\n\n\[1\]: <https:\/\/corpus\.phaseline\.invalid\//);
});

test('an expert killed mid-way: only its in-flight section runs again; other experts are not repeated', async () => {
  const crashed = crashOnce((promptId) => promptId === 'e1-h2');
  const jobId = await harness.submit('research', question);
  await drainSurvivingCrashes(crashed);
  await reclaimAfterLease();
  research.provider.intercept = null;
  await harness.drain();

  expect((await readJob(jobId)).status).toBe('completed');
  expect(research.provider.repeatedRequests()).toEqual([crashed.at]);
  const e1h1Calls = research.provider.requests.filter((request) => promptIdOf(request) === 'e1-h1').length;
  const e2h1Calls = research.provider.requests.filter((request) => promptIdOf(request) === 'e2-h1').length;
  expect(e1h1Calls).toBeGreaterThan(0);
  expect(e2h1Calls).toBeGreaterThan(0);
  const sections = await db().collection(`${JOBS}/${jobId}/sections`).where('phase', '==', 'expert-content').get();
  expect(sections.size).toBe(4);
});

test('a section that fails every attempt is skipped and named; the job completes as partial with the wasted cost counted', async () => {
  research.provider.intercept = (request, call) =>
    promptIdOf(request) === 'e2-h1' ? Promise.reject(new MalformedResponseError('garbled answer (injected)')) : call();
  const jobId = await harness.submit('research', question);
  await harness.drain();

  const job = await readJob(jobId);
  expect(job).toMatchObject({ status: 'completed', outcome: 'partial' });
  // One first attempt, two warm and two cold retries: five model calls, all wasted.
  expect(research.provider.requests.filter((request) => promptIdOf(request) === 'e2-h1')).toHaveLength(5);
  expect(job.cost.wastedModelCalls).toBeGreaterThanOrEqual(5);
  const message = (await db().doc(`${JOBS}/${jobId}/results/final`).get()).data();
  expect(message?.missing).toHaveLength(1);
  expect((message?.missing as string[])[0]).toMatch(/^a historian of the field · |· /);
  expect(await report(jobId)).toContain('## Missing from this report');
  const timeline = (await db().collection(`${JOBS}/${jobId}/events`).get()).docs.map((doc) => doc.get('kind') as string);
  expect(timeline).toContain('section-skipped');
});

describe('fault 8: a provider error wave across all workers', () => {
  let waveHarness: EngineHarness;
  let waveResearch: ResearchSetup;
  const waveMinutes = 5;
  beforeAll(() => {
    waveHarness = engineHarness('research-wave', (firestore, clock) => {
      waveResearch = researchSetup(firestore.db, clock, { epochMs: waveStartMs, errorWaves: [{ startMs: 0, endMs: waveMinutes * 60_000, status: 503 }] });
      return waveResearch.registry;
    });
  });
  beforeEach(() => waveHarness.firestore.reset());
  afterAll(() => waveHarness.firestore.close());

  test('sends the jobs to waiting ("provider unavailable") and they resume and complete when it clears', async () => {
    const jobs = [await waveHarness.submit('research', question), await waveHarness.submit('research', { ...question, experts: 1 })];
    await waveHarness.drain();
    const waiting = await Promise.all(jobs.map(async (jobId) => decodeJob(jobId, (await waveHarness.firestore.db.doc(`${JOBS}/${jobId}`).get()).data())));
    for (const job of waiting) {
      expect(job.status).toBe('waiting');
      expect(job.waiting).toMatchObject({ reason: 'provider', options: [] });
      expect(job.waiting?.question).toMatch(/unavailable/);
      expect(job.waiting?.untilMs).toBeGreaterThan(waveHarness.clock.now());
    }
    const circuit = await waveHarness.firestore.db.doc('circuits/offline').get();
    expect(circuit.get('state')).toBe('open');

    // Time passes; the sweeper lets probes through every cool-down until the wave is over.
    let callsDuringWave = 0;
    for (let minute = 0; minute < waveMinutes + 5; minute += 1) {
      if (waveHarness.clock.now() < waveStartMs + waveMinutes * 60_000) callsDuringWave = waveResearch.provider.requests.length;
      waveHarness.clock.advance(61_000);
      await sweep({ store: waveHarness.store, queue: waveHarness.queue, log: () => undefined }, waveHarness.clock.now());
      await waveHarness.drain();
    }
    for (const jobId of jobs) {
      const job = decodeJob(jobId, (await waveHarness.firestore.db.doc(`${JOBS}/${jobId}`).get()).data());
      expect(job.status).toBe('completed');
      expect(job.attempts).toBeLessThan(waveHarness.options.maxAttempts);
    }
    expect((await waveHarness.firestore.db.doc('circuits/offline').get()).get('state')).toBe('closed');
    // The provider was probed, not hammered: a handful of calls in five minutes of outage.
    expect(callsDuringWave).toBeGreaterThan(0);
    expect(callsDuringWave).toBeLessThanOrEqual(20);
  });
});

describe('only part of a multi-tool result set is delivered', () => {
  let partialHarness: EngineHarness;
  let partial: ResearchSetup;
  beforeAll(() => {
    partialHarness = engineHarness('research-partial', (firestore, clock) => {
      partial = researchSetup(firestore.db, clock, { epochMs: waveStartMs, partialToolResultsRate: 0.5 });
      return partial.registry;
    });
  });
  afterAll(() => partialHarness.firestore.close());

  test('fault 4: the delivered results of a partly delivered multi-tool set are kept and only the undelivered calls run again', async () => {
    const before = partial.toolbox.stats();
    const jobId = await partialHarness.submit('research', question);
    await partialHarness.drain();
    expect(decodeJob(jobId, (await partialHarness.firestore.db.doc(`${JOBS}/${jobId}`).get()).data()).status).toBe('completed');

    const after = partial.toolbox.stats();
    const runs = (id: string) => (after.byCallId[id] ?? 0) - (before.byCallId[id] ?? 0);
    const deliveries = (id: string) => (after.deliveredByCallId[id] ?? 0) - (before.deliveredByCallId[id] ?? 0);
    const ids = Object.keys(after.byCallId).filter((id) => runs(id) > 0);
    const interrupted = ids.filter((id) => runs(id) > deliveries(id));
    expect(interrupted.length).toBeGreaterThan(0);
    // A delivered (recorded) result is never produced twice; only the interrupted calls ran again.
    expect(ids.filter((id) => deliveries(id) > 1)).toEqual([]);
    // The model is never asked again for a turn it gave: no request is sent twice. (A call that
    // keeps failing ends in a clean thread, whose prompt says it is a fresh start.)
    const sent = partial.provider.requests.map((request) => JSON.stringify(request.messages));
    expect(sent.filter((messages, index) => sent.indexOf(messages) !== index)).toEqual([]);
    // Every request carried complete groups only: each call the model saw answered, once.
    for (const request of partial.provider.requests) {
      const calls = request.messages.flatMap((message) => (message.role === 'assistant' ? (message.toolCalls ?? []).map((call) => call.id) : []));
      const results = request.messages.flatMap((message) => (message.role === 'tool' ? [message.toolCallId] : []));
      expect(results.sort()).toEqual(calls.sort());
    }
  });
});
