/**
 * Versions in flight, on the official Firestore emulator: two versions of one pipeline, where
 * version 2 changes the `items` phase's checkpoint and section schemas (counts become cents), and
 * jobs caught by the deploy at each point: mid-phase (sections of version 1 recorded), between
 * phases (a checkpoint of version 1), and the other way round (a worker of version 1 still running
 * when version 2 wrote). Each one is migrated, or fails with the phase's stated reason, or waits for
 * a newer worker; none loops (every drain is bounded and ends with an empty queue).
 */
import { FieldValue, type Query, type QuerySnapshot } from 'firebase-admin/firestore';
import { z } from 'zod';
import { stepTaskId, type JobRecord } from '../../functions/src/core/job';
import { defineFanOutPhase, definePhase, definePipeline, pipelineRegistry, type OlderVersionReading, type PhaseOutcome, type PipelineRegistry, type StepContext } from '../../functions/src/core/pipeline';
import { redriveJob } from '../../functions/src/engine/operator';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { submissionValidator, submitJob } from '../../functions/src/engine/submit';
import { sweep } from '../../functions/src/engine/sweeper';
import { checkpointPath, jobPath, JOBS } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';
import { heldUnitsPipeline } from '../support/held-units';

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
const readJob = (jobId: string): Promise<JobRecord> => harness.readJob(jobId);
const stored = async (jobId: string, path: string) => (await db().doc(`${JOBS}/${jobId}/${path}`).get()).data();
const published = async (jobId: string) => (await db().doc(`${JOBS}/${jobId}/results/final`).get()).get('markdown') as unknown;
const eventMessages = async (jobId: string, kind: string) =>
  (await db().collection(`${JOBS}/${jobId}/events`).get()).docs.filter((doc) => doc.get('kind') === kind).map((doc) => doc.get('message') as string);

/** Runs the next queued task on a worker of one version. */
async function stepOn(pipelines: PipelineRegistry, worker?: string): Promise<StepOutcome> {
  const next = harness.queue.tasks.shift();
  if (!next) throw new Error('no task queued');
  harness.clock.advance(next.delaySeconds * 1000);
  return runStep({ ...harness.deps(worker), pipelines }, next.task);
}

/** Runs queued tasks on workers of one version, at most `max` of them; the queue must be empty after (no loop). */
async function drainOn(pipelines: PipelineRegistry, max = 30): Promise<StepOutcome[]> {
  const outcomes: StepOutcome[] = [];
  for (let round = 0; round < max; round += 1) {
    if (harness.queue.tasks.length === 0) return outcomes;
    outcomes.push(await stepOn(pipelines));
  }
  throw new Error(`still running after ${max} steps: ${JSON.stringify(kinds(outcomes))}`);
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

describe('versions in flight across a deploy: a fan-out unit result an older version produced, a job started on a newer version met by an older worker, sections a newer phase cannot read', () => {
  /** Submits on the given version of `versioned` (as a worker of that version validated it). */
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
});

/** The collection a query reads, as `parent/collection`. */
function queryTarget(query: Query): string {
  const options = (query as unknown as { _queryOptions: { parentPath: { relativeName: string }; collectionId: string } })._queryOptions;
  return `${options.parentPath.relativeName}/${options.collectionId}`;
}

/** Fan-out units that just finish, for a checkpoint a newer version of their phase wrote. */
const SIDE_UNITS = pipelineRegistry(heldUnitsPipeline('r5-side-units').pipeline);

test('a unit whose stored checkpoint is unreadable (a newer version wrote it) is settled with that reason even when its sections read fails; no unhandled rejection', async () => {
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => unhandled.push(reason);
  process.on('unhandledRejection', onUnhandled);
  let failingSections: jest.SpyInstance | undefined;
  try {
    const jobId = await harness.submit('r5-side-units', { units: 1 });
    expect((await stepOn(SIDE_UNITS)).kind).toBe('fanned-out');
    const [task] = harness.queue.drain();
    // A worker of version 2 of the phase checkpointed it meanwhile (a rolling deploy): this worker must not read it.
    await db().doc(checkpointPath(jobId, 'experts')).set({ phase: 'experts', state: { total: 1 }, epoch: 1, recordedAtMs: harness.clock.now(), version: 2 });
    const queryPrototype = Object.getPrototypeOf(db().collection('x').where('a', '==', 1)) as { get: (this: Query) => Promise<QuerySnapshot> };
    const get = queryPrototype.get;
    let sectionReads = 0;
    failingSections = jest.spyOn(queryPrototype, 'get').mockImplementation(async function (this: Query) {
      if (queryTarget(this) === `${JOBS}/${jobId}/sections`) {
        sectionReads += 1;
        await new Promise((resolve) => setTimeout(resolve, 50));
        throw Object.assign(new Error('7 PERMISSION_DENIED: injected read failure'), { code: 7 });
      }
      return get.call(this);
    });
    const outcome: StepOutcome = await runStep({ ...harness.deps('unit-worker'), pipelines: SIDE_UNITS }, task!.task);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(outcome).toMatchObject({ kind: 'requeued' });
    const unitDoc = (await db().collection(`${JOBS}/${jobId}/units`).get()).docs[0];
    expect(unitDoc?.get('lastError.message')).toMatch(/written by its version 2, newer than this worker's version 1/);
    expect(sectionReads).toBeLessThanOrEqual(1);
    expect(unhandled).toEqual([]);
  } finally {
    failingSections?.mockRestore();
    process.off('unhandledRejection', onUnhandled);
  }
});

