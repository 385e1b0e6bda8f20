/**
 * Versions in flight across a deploy: a fan-out unit result
 * an older version produced, a job started on a newer version met by an older worker, and sections
 * a newer phase cannot read checked before any new work.
 */
import { z } from 'zod';
import { stepTaskId } from '../../functions/src/core/job';
import { defineFanOutPhase, definePhase, definePipeline, pipelineRegistry, type PipelineRegistry, type StepContext } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { sweep } from '../../functions/src/engine/sweeper';
import { decodeJob } from '../../functions/src/store/codec';
import { jobPath, JOBS } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';

type Input = { items: number };
const input = z.strictObject({ items: z.number().int().min(1).max(10) });

const harness = engineSuite('versions-in-flight', new Map());

const db = () => harness.firestore.db;
const kinds = (outcomes: readonly { kind: string }[]) => outcomes.map((outcome) => outcome.kind);
const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(jobPath(jobId)).get()).data());
const published = async (jobId: string) => (await db().doc(`${JOBS}/${jobId}/results/final`).get()).get('markdown') as unknown;

async function stepOn(pipelines: PipelineRegistry): Promise<StepOutcome> {
  const next = harness.queue.tasks.shift();
  if (!next) throw new Error('no task queued');
  harness.clock.advance(next.delaySeconds * 1000);
  return runStep({ ...harness.deps(), pipelines }, next.task);
}
async function drainOn(pipelines: PipelineRegistry, max = 30): Promise<StepOutcome[]> {
  const outcomes: StepOutcome[] = [];
  for (let round = 0; round < max; round += 1) {
    if (harness.queue.tasks.length === 0) return outcomes;
    outcomes.push(await stepOn(pipelines));
  }
  throw new Error(`still running after ${max} steps: ${JSON.stringify(kinds(outcomes))}`);
}
async function submit(pipelineVersion: number, items: number): Promise<string> {
  const created = await harness.store.createJob({ owner: 'user-1', pipeline: 'versioned', input: { items }, conversationId: null, idempotencyKey: null, pipelineVersion });
  if (!('created' in created)) throw new Error('unexpected');
  await harness.queue.enqueue({ jobId: created.job.id, step: 0 }, { id: stepTaskId(created.job.id, 0, 0) });
  return created.job.id;
}

const count = definePhase<Input, { n: number }>({
  name: 'count',
  state: z.strictObject({ n: z.number().int() }),
  run: (context) => Promise.resolve({ kind: 'done', state: { n: context.input.items } }),
});

// ---- 1. Fan-out unit results carry no version: a phase that refuses version 1 still joins them ----

const unitIds = (n: number) => Array.from({ length: n }, (_, index) => `p${index}`);
function measure(version: 1 | 2) {
  return defineFanOutPhase<Input, { total: number }, { size: number }>({
    name: 'measure',
    ...(version === 2 ? { version: 2, older: { 1: { refuse: 'version 1 measured sizes in kB; version 2 measures bytes' } } } : {}),
    state: z.strictObject({ total: z.number().int() }),
    needs: [count],
    fanOut: {
      units: (context) => unitIds(context.checkpoint(count).n),
      unitState: z.strictObject({ size: z.number().int() }),
      // Every unit measures 1 kB: version 1 says 1, version 2 says 1000.
      runUnit: () => Promise.resolve({ kind: 'done', state: { size: version === 1 ? 1 : 1000 } }),
      join: (results) => ({ total: [...results.values()].reduce((sum, result) => sum + result.size, 0) }),
    },
  });
}
function fanOutPipeline(version: 1 | 2) {
  const phase = measure(version);
  return pipelineRegistry(
    definePipeline<Input>({
      name: 'versioned',
      description: `fan-out v${version}`,
      version,
      input,
      phases: [count, phase],
      publish: (context) => ({ outcome: 'complete', title: 'Size', markdown: `${context.checkpoint(phase).total}`, missing: [] }),
    }),
  );
}

test('a fan-out phase at version 2 that REFUSES version 1 never joins a unit result version 1 wrote (it fails with the reason, or redoes it)', async () => {
  const V1 = fanOutPipeline(1);
  const V2 = fanOutPipeline(2);
  const jobId = await submit(1, 3);
  expect((await stepOn(V1)).kind).toBe('handed-off'); // count
  expect((await stepOn(V1)).kind).toBe('fanned-out'); // three unit tasks
  // The deploy lands after one unit finished on version 1.
  const unitTask = harness.queue.tasks.findIndex((task) => task.task.unit === 'p0');
  const [p0] = harness.queue.tasks.splice(unitTask, 1);
  expect((await runStep({ ...harness.deps(), pipelines: V1 }, p0!.task)).kind).toBe('unit-done');
  await drainOn(V2);
  const job = await readJob(jobId);
  // Promise: "never mixes versions silently". Either the refusal is honoured (the job fails saying so),
  // or the version-1 unit is redone under version 2 (3000 bytes).
  if (job.status === 'failed') expect(job.lastError?.message).toContain('version 1 measured sizes in kB');
  else expect(await published(jobId)).toBe('3000');
});

// ---- Bug 21: a deploy that raises a fan-out phase's version never fails the jobs in flight ----

/** Version 1 measures each unit in kB (`size`), version 2 in bytes (`bytes`), and says how to read version 1's results, or says nothing. */
const measured = { runs: [] as string[], waitOnce: new Set<string>() };
function measureBytes(version: 1 | 2, older: 'migrates' | 'declares nothing') {
  return defineFanOutPhase<Input, { total: number }, { size: number } | { bytes: number }>({
    name: 'measure',
    // Both versions total in bytes: a checkpoint reads as it is; a unit result is converted.
    ...(version === 2 ? { version: 2, ...(older === 'migrates' ? { older: { 1: { state: (old: unknown) => old, unitState: (old: unknown) => ({ bytes: (old as { size: number }).size * 1000 }) } } } : {}) } : {}),
    state: z.strictObject({ total: z.number().int() }),
    needs: [count],
    fanOut: {
      units: (context) => unitIds(context.checkpoint(count).n),
      unitState: version === 1 ? z.strictObject({ size: z.number().int() }) : z.strictObject({ bytes: z.number().int() }),
      runUnit: (context, unit) => {
        measured.runs.push(`v${version}:${unit}`);
        if (measured.waitOnce.delete(unit)) return Promise.resolve({ kind: 'wait', reason: 'provider', question: 'The meter is down', untilMs: context.clock.now() + 60_000 });
        return Promise.resolve({ kind: 'done', state: version === 1 ? { size: 1 } : { bytes: 1000 } });
      },
      join: (results) => ({ total: [...results.values()].reduce((sum, result) => sum + ('bytes' in result ? result.bytes : result.size * 1000), 0) }),
    },
  });
}
function measurePipeline(version: 1 | 2, older: 'migrates' | 'declares nothing' = 'migrates') {
  const phase = measureBytes(version, older);
  return pipelineRegistry(
    definePipeline<Input>({
      name: 'versioned',
      description: `fan-out in ${version === 1 ? 'kB' : 'bytes'}`,
      version,
      input,
      phases: [count, phase],
      publish: (context) => ({ outcome: 'complete', title: 'Bytes', markdown: `${context.checkpoint(phase).total}`, missing: [] }),
    }),
  );
}
/** Runs the task of `unit` (taken out of the queue) on a worker of `pipelines`. */
async function unitStepOn(pipelines: PipelineRegistry, unit: string): Promise<StepOutcome> {
  const index = harness.queue.tasks.findIndex((task) => task.task.unit === unit);
  const [task] = harness.queue.tasks.splice(index, 1);
  if (index === -1 || !task) throw new Error(`no task for unit ${unit}`);
  harness.clock.advance(task.delaySeconds * 1000);
  return runStep({ ...harness.deps(), pipelines }, task.task);
}
async function fannedOutOn(pipelines: PipelineRegistry, units: number): Promise<string> {
  measured.runs.length = 0;
  measured.waitOnce.clear();
  const jobId = await submit(1, units);
  expect(kinds([await stepOn(pipelines), await stepOn(pipelines)])).toEqual(['handed-off', 'fanned-out']);
  return jobId;
}

describe('bug 21: unit results across a deploy that raises the phase version', () => {
  test('bug 21: older first: a unit result version 1 produced is migrated at the join when version 2 declares how', async () => {
    const jobId = await fannedOutOn(measurePipeline(1), 3);
    expect((await unitStepOn(measurePipeline(1), 'p0')).kind).toBe('unit-done');
    // The deploy lands: the other units, and the join, run on version 2.
    const outcomes = await drainOn(measurePipeline(2));
    expect({ outcomes: kinds(outcomes), status: (await readJob(jobId)).status, answer: await published(jobId), runs: measured.runs }).toEqual({
      outcomes: ['unit-done', 'unit-done', 'completed'],
      status: 'completed',
      answer: '3000',
      runs: ['v1:p0', 'v2:p1', 'v2:p2'],
    });
  });

  test('bug 21: older first: with no migration declared for it, the unit runs again under version 2 (never a failed job)', async () => {
    const jobId = await fannedOutOn(measurePipeline(1), 3);
    expect((await unitStepOn(measurePipeline(1), 'p0')).kind).toBe('unit-done');
    const V2 = measurePipeline(2, 'declares nothing');
    const outcomes = await drainOn(V2);
    const job = await readJob(jobId);
    expect({ outcomes: kinds(outcomes), status: job.status, error: job.lastError?.message ?? null, answer: await published(jobId), runs: measured.runs }).toEqual({
      outcomes: ['unit-done', 'unit-done', 'unit-done', 'completed'],
      status: 'completed',
      error: null,
      answer: '3000',
      runs: ['v1:p0', 'v2:p1', 'v2:p2', 'v2:p0'],
    });
    const events = (await db().collection(`${JOBS}/${jobId}/events`).get()).docs.map((doc) => ({ kind: doc.get('kind') as string, message: doc.get('message') as string }));
    expect(events.find((event) => event.kind === 'rerun')?.message).toMatch(/^p0: runs again: Phase measure \(version 2\) cannot read its unit result written by version 1/);
  });

  test('bug 21: newer first: a worker of version 1 finishing the last unit beside version 2 results is requeued for a newer worker, never fails the job', async () => {
    const jobId = await fannedOutOn(measurePipeline(1), 3);
    const V2 = measurePipeline(2, 'declares nothing');
    expect((await unitStepOn(V2, 'p0')).kind).toBe('unit-done');
    expect((await unitStepOn(V2, 'p1')).kind).toBe('unit-done');
    // A worker of the old version still runs while the deploy rolls out, and gets the last unit.
    const lastOnOld = await unitStepOn(measurePipeline(1), 'p2');
    const meanwhile = await readJob(jobId);
    const outcomes = await drainOn(V2);
    expect({ lastOnOld: lastOnOld.kind, meanwhile: meanwhile.status, outcomes: kinds(outcomes), status: (await readJob(jobId)).status, answer: await published(jobId), runs: measured.runs }).toEqual({
      lastOnOld: 'requeued',
      meanwhile: 'running',
      outcomes: ['unit-done', 'completed'],
      status: 'completed',
      answer: '3000',
      runs: ['v2:p0', 'v2:p1', 'v1:p2', 'v2:p2'],
    });
  });

  test('bug 21: a unit result reused when the fan-out starts again (after a wait) is read through its migration and kept as version 2\'s: it is not redone', async () => {
    const jobId = await fannedOutOn(measurePipeline(1), 2);
    measured.waitOnce.add('p1');
    expect((await unitStepOn(measurePipeline(1), 'p0')).kind).toBe('unit-done');
    expect((await unitStepOn(measurePipeline(1), 'p1')).kind).toBe('waiting');
    // The job resumes after the deploy: version 2 starts the fan-out again, reusing p0 through its migration.
    const waiting = await readJob(jobId);
    harness.clock.set(waiting.waiting?.untilMs ?? 0);
    expect((await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now())).resumed).toBe(1);
    const outcomes = await drainOn(measurePipeline(2));
    const p0 = (await db().doc(`${JOBS}/${jobId}/units/measure~p0`).get()).data();
    expect({ outcomes: kinds(outcomes), status: (await readJob(jobId)).status, answer: await published(jobId), runs: measured.runs, p0: { result: p0?.result as unknown, version: p0?.resultVersion as unknown } }).toEqual({
      outcomes: ['fanned-out', 'unit-done', 'completed'],
      status: 'completed',
      answer: '2000',
      runs: ['v1:p0', 'v1:p1', 'v2:p1'],
      p0: { result: { bytes: 1000 }, version: 2 },
    });
  });
});

// ---- 2. The job's pipelineVersion is never consulted: a version 1 worker finishes a job a version 2 worker was running ----

function auditPipelines() {
  const summaryV1 = definePhase<Input, { text: string }>({
    name: 'summary',
    state: z.strictObject({ text: z.string() }),
    needs: [count],
    run: (context) => Promise.resolve({ kind: 'done', state: { text: `${context.checkpoint(count).n} items` } }),
  });
  const audit = definePhase<Input, { ok: boolean }>({
    name: 'audit',
    version: 2,
    state: z.strictObject({ ok: z.boolean() }),
    needs: [count],
    run: () => Promise.resolve({ kind: 'done', state: { ok: true } }),
  });
  const summaryV2 = definePhase<Input, { text: string }>({
    name: 'summary',
    version: 2,
    older: { 1: { refuse: 'version 1 summaries were not audited' } },
    state: z.strictObject({ text: z.string() }),
    needs: [count, audit],
    run: (context) => Promise.resolve({ kind: 'done', state: { text: `${context.checkpoint(count).n} items, audited: ${String(context.checkpoint(audit).ok)}` } }),
  });
  const v1 = definePipeline<Input>({ name: 'versioned', description: 'v1', input, phases: [count, summaryV1], publish: (c) => ({ outcome: 'complete', title: 'S', markdown: c.checkpoint(summaryV1).text, missing: [] }) });
  const v2 = definePipeline<Input>({ name: 'versioned', description: 'v2', version: 2, input, phases: [count, audit, summaryV2], publish: (c) => ({ outcome: 'complete', title: 'S', markdown: c.checkpoint(summaryV2).text, missing: [] }) });
  return { V1: pipelineRegistry(v1), V2: pipelineRegistry(v2) };
}

test('a job started on version 2, holding state version 2 wrote, is left for a version 2 worker, not finished by a version 1 worker', async () => {
  const { V1, V2 } = auditPipelines();
  const jobId = await submit(2, 2);
  expect((await readJob(jobId)).pipelineVersion).toBe(2);
  expect((await stepOn(V2)).kind).toBe('handed-off'); // count
  expect((await stepOn(V2)).kind).toBe('handed-off'); // audit, checkpoint written by version 2
  expect((await db().doc(`${JOBS}/${jobId}/checkpoints/audit`).get()).get('version')).toBe(2);
  // A worker of version 1 (a rollout in progress, or a rollback) gets the next task.
  const outcome = await stepOn(V1);
  // README: "A value written by a later version ... is never read: the job is requeued a minute later for a newer worker".
  // Whatever the version 1 worker did, workers of version 2 then run what is left.
  await drainOn(V2);
  expect({ v1Worker: outcome.kind, status: (await readJob(jobId)).status, answer: await published(jobId) }).toEqual({ v1Worker: 'requeued', status: 'completed', answer: '2 items, audited: true' });
});

// ---- 3. A version 2 phase that declares nothing for version 1 does new work before it fails ----

async function oneSectionPerStep(context: StepContext<Input>, version: number, data: (index: number) => unknown): Promise<'yield' | 'done'> {
  const { n } = context.checkpoint(count);
  const recorded = context.sections().length;
  if (recorded >= n) return 'done';
  runs.push(`v${version}:s${recorded}`);
  await context.recordSection(`s${recorded}`, data(recorded));
  return 'yield';
}
const runs: string[] = [];
function itemsPipelines() {
  const itemsV1 = definePhase<Input, { total: number }>({
    name: 'items',
    state: z.strictObject({ total: z.number().int() }),
    section: z.strictObject({ value: z.number().int() }),
    needs: [count],
    run: async (context) =>
      (await oneSectionPerStep(context, 1, (index) => ({ value: index + 1 }))) === 'yield'
        ? { kind: 'yield' }
        : { kind: 'done', state: { total: context.sections().reduce((sum, section) => sum + (section.data as { value: number }).value, 0) } },
  });
  // Version 2 changes the section schema and declares no reading of version 1 (definePipeline accepts that).
  const itemsV2 = definePhase<Input, { totalCents: number }>({
    name: 'items',
    version: 2,
    state: z.strictObject({ totalCents: z.number().int() }),
    section: z.strictObject({ cents: z.number().int() }),
    needs: [count],
    run: async (context) =>
      (await oneSectionPerStep(context, 2, (index) => ({ cents: (index + 1) * 100 }))) === 'yield'
        ? { kind: 'yield' }
        : { kind: 'done', state: { totalCents: context.sections().reduce((sum, section) => sum + (section.data as { cents: number }).cents, 0) } },
  });
  const v1 = definePipeline<Input>({ name: 'versioned', description: 'v1', input, phases: [count, itemsV1], publish: (c) => ({ outcome: 'complete', title: 'T', markdown: `${c.checkpoint(itemsV1).total}`, missing: [] }) });
  const v2 = definePipeline<Input>({ name: 'versioned', description: 'v2', version: 2, input, phases: [count, itemsV2], publish: (c) => ({ outcome: 'complete', title: 'T', markdown: `${c.checkpoint(itemsV2).totalCents}`, missing: [] }) });
  return { V1: pipelineRegistry(v1), V2: pipelineRegistry(v2) };
}

test('sections of version 1 that version 2 cannot read (it declares nothing) fail the job at its next step, before any new work', async () => {
  runs.length = 0;
  const { V1, V2 } = itemsPipelines();
  const jobId = await submit(1, 4);
  for (let step = 0; step < 3; step += 1) expect((await stepOn(V1)).kind).toBe('handed-off'); // count, s0, s1
  expect(runs).toEqual(['v1:s0', 'v1:s1']);
  const outcomes = await drainOn(V2);
  // README: "by an earlier version the phase refuses, declares nothing for, ... the job fails at its next step with that reason".
  expect({ outcomes: kinds(outcomes), runs }).toEqual({ outcomes: ['failed'], runs: ['v1:s0', 'v1:s1'] });
  expect((await readJob(jobId)).lastError?.message).toContain('declares no way to read that version');
});
