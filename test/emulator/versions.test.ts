/**
 * Versions in flight, on the official Firestore emulator: two versions of one pipeline, where
 * version 2 changes the `items` phase's checkpoint and section schemas (counts become cents), and
 * jobs caught by the deploy at each point: mid-phase (sections of version 1 recorded), between
 * phases (a checkpoint of version 1), and the other way round (a worker of version 1 still running
 * when version 2 wrote). Each one is migrated, or fails with the phase's stated reason, or waits for
 * a newer worker; none loops (every drain is bounded and ends with an empty queue).
 */
import { FieldValue } from 'firebase-admin/firestore';
import { z } from 'zod';
import type { JobRecord } from '../../functions/src/core/job';
import { definePhase, definePipeline, pipelineRegistry, type OlderVersionReading, type PhaseOutcome, type PipelineRegistry, type StepContext } from '../../functions/src/core/pipeline';
import { redriveJob } from '../../functions/src/engine/operator';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { submissionValidator, submitJob } from '../../functions/src/engine/submit';
import { decodeJob } from '../../functions/src/store/codec';
import { jobPath, JOBS } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';

type Input = { items: number };
const input = z.strictObject({ items: z.number().int().min(1).max(10) });

/** Section executions (the work, not the recording), by version and section ID. */
const runs = new Map<string, number>();
const ran = (version: number, id: string) => runs.set(`v${version}:${id}`, (runs.get(`v${version}:${id}`) ?? 0) + 1);

const count = definePhase<Input, { n: number }>({
  name: 'count',
  state: z.strictObject({ n: z.number().int() }),
  run: (context) => Promise.resolve({ kind: 'done', state: { n: context.input.items } }),
});

/** One section per step, then a yield: a job is caught by a deploy with some of its sections recorded. */
async function oneSectionPerStep<TState>(context: StepContext<Input>, version: number, data: (index: number) => unknown, done: () => TState): Promise<PhaseOutcome<TState>> {
  const { n } = context.checkpoint(count);
  const recorded = context.sections().length;
  if (recorded >= n) return { kind: 'done', state: done() };
  ran(version, `s${recorded}`);
  await context.recordSection(`s${recorded}`, data(recorded));
  return { kind: 'yield' };
}

// ---- Version 1: items counted in whole units --------------------------------------------------

const itemsV1 = definePhase<Input, { total: number }>({
  name: 'items',
  state: z.strictObject({ total: z.number().int() }),
  section: z.strictObject({ value: z.number().int() }),
  needs: [count],
  run: (context) => oneSectionPerStep(context, 1, (index) => ({ value: index + 1 }), () => ({ total: context.sections().reduce((sum, section) => sum + (section.data as { value: number }).value, 0) })),
});

const summaryV1 = definePhase<Input, { text: string }>({
  name: 'summary',
  state: z.strictObject({ text: z.string() }),
  needs: [itemsV1],
  run: (context) => Promise.resolve({ kind: 'done', state: { text: `${context.checkpoint(itemsV1).total} units` } }),
});

const v1 = definePipeline<Input>({
  name: 'versioned',
  description: 'Version 1',
  input,
  phases: [count, itemsV1, summaryV1],
  publish: (context) => ({ outcome: 'complete', title: 'Total', markdown: context.checkpoint(summaryV1).text, missing: [] }),
});

// ---- Version 2: items counted in cents; how it reads what version 1 wrote is declared ----------

function version2(older: OlderVersionReading) {
  const items = definePhase<Input, { totalCents: number }>({
    name: 'items',
    version: 2,
    older: { 1: older },
    state: z.strictObject({ totalCents: z.number().int() }),
    section: z.strictObject({ cents: z.number().int() }),
    needs: [count],
    run: (context) =>
      oneSectionPerStep(context, 2, (index) => ({ cents: (index + 1) * 100 }), () => ({ totalCents: context.sections().reduce((sum, section) => sum + (section.data as { cents: number }).cents, 0) })),
  });
  const summary = definePhase<Input, { text: string }>({
    name: 'summary',
    state: z.strictObject({ text: z.string() }),
    needs: [items],
    run: (context) => Promise.resolve({ kind: 'done', state: { text: `${context.checkpoint(items).totalCents} cents` } }),
  });
  return definePipeline<Input>({
    name: 'versioned',
    description: 'Version 2',
    version: 2,
    input,
    phases: [count, items, summary],
    publish: (context) => ({ outcome: 'complete', title: 'Total', markdown: context.checkpoint(summary).text, missing: [] }),
  });
}

const REFUSAL = 'version 1 counted items in whole units, and which currency they were in was never recorded';
const v2 = version2({ state: (old) => ({ totalCents: (old as { total: number }).total * 100 }), section: (old) => ({ cents: (old as { value: number }).value * 100 }) });
const v2Refusing = version2({ refuse: REFUSAL });
const V1 = pipelineRegistry(v1);
const V2 = pipelineRegistry(v2);
const V2_REFUSING = pipelineRegistry(v2Refusing);

const harness = engineSuite('versions', V1, {
  beforeEach: () => {
    runs.clear();
  },
});

const db = () => harness.firestore.db;
const kinds = (outcomes: readonly { kind: string }[]) => outcomes.map((outcome) => outcome.kind);
const readJob = async (jobId: string): Promise<JobRecord> => decodeJob(jobId, (await db().doc(jobPath(jobId)).get()).data());
const stored = async (jobId: string, path: string) => (await db().doc(`${JOBS}/${jobId}/${path}`).get()).data();
const published = async (jobId: string) => (await db().doc(`${JOBS}/${jobId}/results/final`).get()).get('markdown') as unknown;
const eventMessages = async (jobId: string, kind: string) =>
  (await db().collection(`${JOBS}/${jobId}/events`).get()).docs.filter((doc) => doc.get('kind') === kind).map((doc) => doc.get('message') as string);

/** Runs queued tasks on workers of one version, at most `max` of them; the queue must be empty after (no loop). */
async function drainOn(pipelines: PipelineRegistry, max = 20): Promise<StepOutcome[]> {
  const outcomes: StepOutcome[] = [];
  for (let round = 0; round < max; round += 1) {
    const next = harness.queue.tasks.shift();
    if (!next) return outcomes;
    harness.clock.advance(next.delaySeconds * 1000);
    outcomes.push(await runStep({ ...harness.deps(), pipelines }, next.task));
  }
  throw new Error(`still running after ${max} steps: ${JSON.stringify(kinds(outcomes))}`);
}

/** Runs the next queued task on a worker of one version. */
async function stepOn(pipelines: PipelineRegistry): Promise<StepOutcome> {
  const next = harness.queue.tasks.shift();
  if (!next) throw new Error('no task queued');
  harness.clock.advance(next.delaySeconds * 1000);
  return runStep({ ...harness.deps(), pipelines }, next.task);
}

/** Runs `steps` tasks on version 1 workers: the job is then where the deploy finds it. */
async function onVersion1(items: number, steps: number): Promise<string> {
  const jobId = await harness.submit('versioned', { items }, 'user-1');
  const outcomes: StepOutcome[] = [];
  for (let step = 0; step < steps; step += 1) {
    const next = harness.queue.tasks.shift();
    if (!next) break;
    outcomes.push(await runStep({ ...harness.deps(), pipelines: V1 }, next.task));
  }
  expect(outcomes.every((outcome) => outcome.kind === 'handed-off')).toBe(true);
  return jobId;
}

describe('a job caught by the deploy mid-phase (sections of version 1 recorded)', () => {
  test('version 2 migrates them on reading, records the rest in its own schema, and finishes; nothing is redone', async () => {
    // count, then two of the four items sections.
    const jobId = await onVersion1(4, 3);
    expect(await stored(jobId, 'sections/items~-~s1')).toMatchObject({ data: { value: 2 } });

    expect(kinds(await drainOn(V2))).toEqual(['handed-off', 'handed-off', 'handed-off', 'handed-off', 'completed']);
    expect(Object.fromEntries(runs)).toEqual({ 'v1:s0': 1, 'v1:s1': 1, 'v2:s2': 1, 'v2:s3': 1 });
    // 100 + 200 migrated, 300 + 400 recorded by version 2.
    expect(await published(jobId)).toBe('1000 cents');
    expect(await stored(jobId, 'checkpoints/items')).toMatchObject({ state: { totalCents: 1000 }, version: 2 });
    // What version 1 wrote is read through the migration, never rewritten; each section records the version that wrote it.
    expect(await stored(jobId, 'sections/items~-~s1')).toMatchObject({ data: { value: 2 }, version: 1 });
    expect(await stored(jobId, 'sections/items~-~s3')).toMatchObject({ version: 2 });
  });

  test('a version 2 that refuses them fails the job at its next step, with the reason; nothing is redone', async () => {
    const jobId = await onVersion1(4, 3);
    expect(kinds(await drainOn(V2_REFUSING))).toEqual(['failed']);
    const job = await readJob(jobId);
    expect(job.status).toBe('failed');
    expect(job.lastError).toMatchObject({ code: 'terminal', retryable: false });
    // Sections record the version that wrote them: the refusal names it exactly (no schema guess).
    expect(job.lastError?.message).toBe(`Phase items (version 2) refuses its section written by version 1: ${REFUSAL}`);
    expect((await eventMessages(jobId, 'failed'))[0]).toContain(REFUSAL);
    expect([...runs.keys()]).toEqual(['v1:s0', 'v1:s1']);
  });
});

describe('a job caught by the deploy between phases (a checkpoint of version 1)', () => {
  test('version 2 migrates the checkpoint for the phase that needs it, and finishes', async () => {
    // count, four items sections, the items checkpoint: summary is next.
    const jobId = await onVersion1(4, 6);
    expect(await stored(jobId, 'checkpoints/items')).toMatchObject({ state: { total: 10 }, version: 1 });
    expect(kinds(await drainOn(V2))).toEqual(['handed-off', 'completed']);
    expect(await published(jobId)).toBe('1000 cents');
    expect(await stored(jobId, 'checkpoints/items')).toMatchObject({ state: { total: 10 }, version: 1 });
  });

  test('a checkpoint written before versions existed (no version recorded) reads as version 1', async () => {
    const jobId = await onVersion1(2, 4);
    const ref = db().doc(`${JOBS}/${jobId}/checkpoints/items`);
    const { version: _version, ...legacy } = (await ref.get()).data()!;
    await ref.set(legacy);
    expect(kinds(await drainOn(V2))).toEqual(['handed-off', 'completed']);
    expect(await published(jobId)).toBe('300 cents');
  });

  test('a version 2 that refuses it fails the job with the reason; an operator re-drives it from that phase and it finishes under version 2', async () => {
    const jobId = await onVersion1(4, 6);
    expect(kinds(await drainOn(V2_REFUSING))).toEqual(['failed']);
    const failed = await readJob(jobId);
    expect(failed.lastError?.message).toBe(`Phase items (version 2) refuses its checkpoint written by version 1: ${REFUSAL}`);
    // The summary never ran on state version 2 refuses.
    expect(await stored(jobId, 'checkpoints/summary')).toBeUndefined();

    const redriven = await redriveJob(harness.store, harness.queue, { jobId, fromPhase: 'items', by: 'ops-ana', reason: 'recount under version 2' }, harness.clock.now(), { pipelines: V2_REFUSING });
    expect(redriven.setAside).toBe(5); // the items checkpoint and its four sections
    expect(kinds(await drainOn(V2_REFUSING))).toEqual(['handed-off', 'handed-off', 'handed-off', 'handed-off', 'handed-off', 'handed-off', 'completed']);
    expect(await published(jobId)).toBe('1000 cents');
    expect((await readJob(jobId)).pipelineVersion).toBeNull(); // the harness submits without the validator
  });
});

describe('a worker of version 1 still running after version 2 wrote (a deploy rolling out, or a rollback)', () => {
  async function checkpointedByVersion2(): Promise<string> {
    const jobId = await harness.submit('versioned', { items: 2 }, 'user-1');
    // count, two sections, the items checkpoint, all on version 2: summary is next.
    for (let step = 0; step < 4; step += 1) expect((await runStep({ ...harness.deps(), pipelines: V2 }, harness.queue.tasks.shift()!.task)).kind).toBe('handed-off');
    expect(await stored(jobId, 'checkpoints/items')).toMatchObject({ version: 2 });
    return jobId;
  }

  test('it leaves the job to a newer worker: requeued a minute later, and a worker of version 2 finishes it', async () => {
    const jobId = await checkpointedByVersion2();
    const outcome = await stepOn(V1);
    expect(outcome).toMatchObject({ kind: 'requeued', attempts: 1 });
    expect((outcome as { delayMs: number }).delayMs).toBeGreaterThanOrEqual(60_000);
    const job = await readJob(jobId);
    expect(job.lastError?.message).toBe(
      "The checkpoint of phase items was written by its version 2, newer than this worker's version 1 (a deploy in progress, or a rollback): left for a worker of version 2 or later",
    );
    expect(await stored(jobId, 'checkpoints/summary')).toBeUndefined();
    expect(kinds(await drainOn(V2))).toEqual(['handed-off', 'completed']);
    expect(await published(jobId)).toBe('300 cents');
  });

  test('with no newer worker ever coming back, it fails once its attempts are spent, saying why; it never loops', async () => {
    const jobId = await checkpointedByVersion2();
    expect(kinds(await drainOn(V1))).toEqual(['requeued', 'requeued', 'requeued', 'requeued', 'failed']);
    const job = await readJob(jobId);
    expect(job.status).toBe('failed');
    expect(job.lastError?.message).toMatch(/^The checkpoint of phase items was written by its version 2, newer than this worker's version 1/);
    expect(await stored(jobId, 'checkpoints/summary')).toBeUndefined();
  });

  test('a section recorded with a newer version is not read either', async () => {
    const jobId = await onVersion1(4, 2);
    await db().doc(`${JOBS}/${jobId}/sections/items~-~s1`).set({ id: 's1', phase: 'items', unit: null, data: { cents: 200, note: 'v3' }, seq: 1, epoch: 9, recordedAtMs: 0, version: 3 });
    expect(await stepOn(V2)).toMatchObject({ kind: 'requeued' });
    expect((await readJob(jobId)).lastError?.message).toMatch(/^The section of phase items was written by its version 3, newer than this worker's version 2/);
    expect([...runs.keys()]).toEqual(['v1:s0']);
  });
});

describe('still refused, never trusted', () => {
  test('a corrupt checkpoint of the present version is refused and its phase redone, as before versions', async () => {
    const jobId = await harness.submit('versioned', { items: 1 }, 'user-1');
    expect(kinds(await drainOn(V2))).toEqual(['handed-off', 'handed-off', 'handed-off', 'handed-off', 'completed']);
    await db().doc(`${JOBS}/${jobId}/checkpoints/items`).update({ state: { totalCents: 'a lot' } });
    await db().doc(jobPath(jobId)).update({ status: 'queued', outcome: null, finishedAt: null });
    await db().doc(`${JOBS}/${jobId}/results/final`).delete();
    const { step } = await readJob(jobId);
    harness.queue.tasks.push({ id: 'again', task: { jobId, step }, delaySeconds: 0 });
    expect(kinds(await drainOn(V2))).toEqual(['handed-off', 'completed']);
    expect((await eventMessages(jobId, 'checkpoint-refused'))[0]).toMatch(/^Stored checkpoint of items failed validation and will be redone: /);
    expect(await published(jobId)).toBe('100 cents');
  });
});

describe('the job records the version it started on', () => {
  test('submit records the version of the pipeline it validated the input against', async () => {
    const validated = submissionValidator(V2)({ pipeline: 'versioned', input: { items: 1 } });
    if (!validated.ok) throw new Error(validated.message);
    const outcome = await submitJob({ store: harness.store, queue: harness.queue, logger: { warn: () => undefined, error: () => undefined } }, { owner: 'user-1', ...validated.value, idempotencyKey: null });
    if (outcome.kind !== 'accepted') throw new Error(outcome.kind);
    expect((await readJob(outcome.job.id)).pipelineVersion).toBe(2);
    expect(await eventMessages(outcome.job.id, 'submitted')).toEqual(['Submitted to versioned (version 2)']);
  });

  test('a job document from before versions existed reads as version 1', async () => {
    const jobId = await harness.submit('versioned', { items: 1 }, 'user-1');
    await db().doc(jobPath(jobId)).update({ pipelineVersion: FieldValue.delete() });
    expect((await readJob(jobId)).pipelineVersion).toBe(1);
    expect(kinds(await drainOn(V1))).toContain('completed');
  });
});
