import { z } from 'zod';
import { defineFanOutPhase, definePipeline, pipelineRegistry, definePhase, type PhaseOutcome, type StepContext } from '../../functions/src/core/pipeline';
import { type DocumentReference, type DocumentSnapshot, type ReadOptions, Timestamp } from 'firebase-admin/firestore';
import { cancelJob } from '../../functions/src/engine/owner-actions';
import { runStep } from '../../functions/src/engine/step';
import { canaryPipeline } from '../../functions/src/pipelines/canary';
import { decodeJob, decodeUnit, encodeJob, encodeUnit, type UnitRecord } from '../../functions/src/store/codec';
import { JOBS } from '../../functions/src/store/paths';
import { unitsPipeline } from '../support/held-units';
import { engineSuite } from '../support/engine';
import { RetryableError } from '../../functions/src/core/errors';
import type { StepTask } from '../../functions/src/core/job';
import { strandedReason, type UnitView } from '../../functions/src/core/invariants';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { sweep } from '../../functions/src/engine/sweeper';
import { JobStore } from '../../functions/src/store/job-store';
import type { TaskQueuePort } from '../../functions/src/store/task-queue';
import { ManualTimers } from '../support/timers';
import { unitRecord } from '../support/records';

/** Units that each record three sections, one per step: every unit yields twice before it finishes. */
const unitRuns = new Map<string, number>();
const steppedPipeline = unitsPipeline(
  'stepped-units',
  async (context, unit) => {
    const done = context.sections().length;
    if (done === 3) return { kind: 'done', state: { value: context.sections().reduce((sum, section) => sum + (section.data as { value: number }).value, 0) } };
    unitRuns.set(`${unit}/${done}`, (unitRuns.get(`${unit}/${done}`) ?? 0) + 1);
    await context.recordSection(`n${done}`, { value: done + 1 });
    return { kind: 'yield' };
  },
  { phase: 'count', maxUnits: 5, description: 'Test pipeline: fan-out units that yield between sections', publish: (context) => ({ outcome: 'complete', title: 'Sum', markdown: JSON.stringify(context.sections()), missing: [] }) },
);

const harness = engineSuite('fanout', pipelineRegistry(canaryPipeline, steppedPipeline));

const text = 'The first paragraph. It has two sentences.\n\nA second one, with extraordinarily long words.\n\nThird!';
const db = () => harness.firestore.db;
const kinds = async (jobId: string) => (await db().collection(`${JOBS}/${jobId}/events`).get()).docs.map((doc) => doc.get('kind') as string);

test('a fan-out runs one task per unit, joins once, and the job completes with every unit in the result', async () => {
  const jobId = await harness.submit('canary', { text });
  const outcomes = await harness.drain();

  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['handed-off', 'fanned-out', 'unit-done', 'unit-done', 'unit-done', 'handed-off', 'completed']);
  const job = decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
  expect(job).toMatchObject({ status: 'completed', fanout: null, progress: { paragraphs: 3, sectionsDone: 3, sectionsTotal: 3 } });
  const units = await db().collection(`${JOBS}/${jobId}/units`).get();
  expect(units.docs.map((doc) => [doc.id, doc.get('status') as string])).toEqual([['measure~p00', 'done'], ['measure~p01', 'done'], ['measure~p02', 'done']]);
  const markdown = (await db().doc(`${JOBS}/${jobId}/results/final`).get()).get('markdown') as string;
  expect(markdown).toContain('3 paragraphs, 15 words.');
  expect(markdown).toContain('Paragraph 2: 7 words, 1 sentences, longest word "extraordinarily"');
  expect((await kinds(jobId)).filter((kind) => kind === 'joined')).toHaveLength(1);
});

test('units finishing at the same moment join exactly once and hand off exactly one next step', async () => {
  const jobId = await harness.submit('canary', { text });
  await harness.drain(2); // split, then the fan-out
  const unitTasks = harness.queue.drain();
  expect(unitTasks.map((recorded) => recorded.task.unit)).toEqual(['p00', 'p01', 'p02']);

  const outcomes = await Promise.all(unitTasks.map((recorded, index) => runStep(harness.deps(`unit-worker-${index}`), recorded.task)));
  expect(outcomes.filter((outcome) => outcome.kind === 'unit-done' && outcome.joined)).toHaveLength(1);
  expect(outcomes.filter((outcome) => outcome.kind === 'unit-done')).toHaveLength(3);
  expect(harness.queue.tasks).toHaveLength(1);
  expect((await kinds(jobId)).filter((kind) => kind === 'joined')).toHaveLength(1);

  // A unit task delivered again after the join finds nothing to do.
  expect((await runStep(harness.deps(), unitTasks[0]!.task)).kind).toBe('not-claimable');
  await harness.drain();
  expect((await db().doc(`${JOBS}/${jobId}`).get()).get('status')).toBe('completed');
});

test('units claiming and finishing at once hold no locks: no transaction, and the fan-out still joins once', async () => {
  // A finish in a transaction that reads the job locks it; on the emulator the unit that lost the race waited about three seconds.
  const jobId = await harness.submit('canary', { text });
  await harness.drain(2);
  const unitTasks = harness.queue.drain();
  const transactions = jest.spyOn(db(), 'runTransaction');
  try {
    const outcomes = await Promise.all(unitTasks.map((recorded, index) => runStep(harness.deps(`racing-worker-${index}`), recorded.task)));
    expect(outcomes.map((outcome) => outcome.kind)).toEqual(['unit-done', 'unit-done', 'unit-done']);
    // The claims, the finishes and the join are conditioned commits: no transaction locks the job.
    expect(transactions).not.toHaveBeenCalled();
  } finally {
    transactions.mockRestore();
  }
  const job = decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
  expect(job.fanout).toBeNull();
  expect((await kinds(jobId)).filter((kind) => kind === 'unit-done')).toHaveLength(3);
  expect((await kinds(jobId)).filter((kind) => kind === 'joined')).toHaveLength(1);
  await harness.drain();
  expect((await db().doc(`${JOBS}/${jobId}`).get()).get('status')).toBe('completed');
});

test('a unit whose fan-out ends between its read and its commit lands nothing: its claim slot fences a commit that does not write the job', async () => {
  const jobId = await harness.submit('stepped-units', { units: 1 });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['fanned-out']);
  const [unitTask] = harness.queue.drain();
  if (!unitTask) throw new Error('no unit task');
  const owner = (await db().doc(`${JOBS}/${jobId}`).get()).get('owner') as string;
  const getAll = db().getAll.bind(db());
  let cancelled = false;
  let unitReads = 0;
  // The claim and then the yield each read the job, the unit and its claim slot; the owner cancels right after the yield's read.
  const reads = jest.spyOn(db(), 'getAll').mockImplementation(async (...refs: (DocumentReference | ReadOptions)[]): Promise<DocumentSnapshot[]> => {
    const snapshots = await getAll(...refs);
    const paths = refs.map((ref) => ('path' in ref ? ref.path : ''));
    const slotRead = paths.length === 3 && paths[0] === `${JOBS}/${jobId}` && paths[1]?.includes('/units/') === true && paths[2]?.includes('/claims/') === true;
    if (slotRead) unitReads += 1;
    if (!cancelled && slotRead && unitReads === 2) {
      cancelled = true;
      await cancelJob(harness.store, { jobId, owner, reason: 'cancelled while its unit commits' });
    }
    return snapshots;
  });
  let outcome;
  try {
    outcome = await runStep(harness.deps('unit-worker'), unitTask.task);
  } finally {
    reads.mockRestore();
    // The stepped pipeline counts its unit runs for the test below.
    unitRuns.clear();
  }
  expect(cancelled).toBe(true);
  expect(outcome.kind).toBe('ownership-lost');
  expect((await db().doc(`${JOBS}/${jobId}`).get()).get('status')).toBe('cancelled');
  const [unit] = (await db().collection(`${JOBS}/${jobId}/units`).get()).docs;
  // The yield would have queued the unit again at its next step and sent its task.
  expect(unit?.get('status')).toBe('running');
  expect(harness.queue.tasks).toEqual([]);
});

test('the canary rejects input that is only whitespace before any job exists', () => {
  expect(canaryPipeline.input.safeParse({ text: '  \n ' }).success).toBe(false);
  expect(canaryPipeline.input.safeParse({ text: 'fine' }).success).toBe(true);
});

test('a unit that yields is continued by a new task (a new task ID per unit step) and each of its sections runs once', async () => {
  const jobId = await harness.submit('stepped-units', { units: 2 });
  const outcomes = await harness.drain();
  expect(outcomes.filter((outcome) => outcome.kind === 'unit-yielded')).toHaveLength(6);
  expect(outcomes.at(-1)?.kind).toBe('completed');
  expect([...unitRuns.values()].every((runs) => runs === 1)).toBe(true);
  expect(unitRuns.size).toBe(6);
  expect((await db().doc(`${JOBS}/${jobId}/checkpoints/count`).get()).get('state')).toEqual({ total: 12 });
  expect(harness.queue.duplicates).toEqual([]);
});

/**
 * Regression tests for the engine holes a review found (issue 11): each names its item as
 * `bug N:` and fails when that fix is reverted. Everything runs on the official Firestore
 * emulator with an injected clock; a "dead" worker is a step whose promise never settles.
 */
describe('engine holes found by review (fan-out, timeline, cost, schemas)', () => {
  type Input = { units: number };
  const input = z.strictObject({ units: z.number().int().min(0).max(5) });
  const hangForever = () => new Promise<never>(() => undefined);

  /** Per-test switches the pipelines below read. */
  const control = {
    /** Phase (or `phase/unit`) runs that die (never settle) before doing anything, by name. */
    deaths: new Map<string, number>(),
    runs: new Map<string, number>(),
    /** Set by the all-reused test: the `check` phase corrupts the gather checkpoint once. */
    corruptGatherOnce: false,
    /** Units whose stored result the `check` phase corrupts along with the checkpoint. */
    corruptUnits: [] as string[],
    /** Errors the `flaky` phase throws, one per run, before it succeeds. */
    errors: [] as Error[],
    waitOutcome: null as PhaseOutcome<{ ok: boolean }> | null,
  };

  function resetControl(): void {
    control.deaths = new Map();
    control.runs = new Map();
    control.corruptGatherOnce = false;
    control.corruptUnits = [];
    control.errors = [];
    control.waitOutcome = null;
  }

  function countRun(name: string): void {
    control.runs.set(name, (control.runs.get(name) ?? 0) + 1);
  }

  async function maybeDie(name: string): Promise<void> {
    const left = control.deaths.get(name) ?? 0;
    if (left > 0) {
      control.deaths.set(name, left - 1);
      await hangForever();
    }
  }

  const gather = defineFanOutPhase<Input, { total: number }, { value: number }>({
    name: 'gather',
    state: z.strictObject({ total: z.number() }),
    fanOut: {
      units: (context) => Array.from({ length: context.input.units }, (_, index) => `u${index}`),
      unitState: z.strictObject({ value: z.number() }),
      runUnit: async (context, unit) => {
        countRun(`gather/${unit}`);
        await maybeDie(`gather/${unit}`);
        context.addCost({ usd: 1 });
        return { kind: 'done', state: { value: 1 } };
      },
      join: (results) => ({ total: [...results.values()].reduce((sum, result) => sum + result.value, 0) }),
    },
  });

  const check = definePhase<Input, { ok: boolean }>({
    name: 'check',
    state: z.strictObject({ ok: z.boolean() }),
    needs: [gather],
    run: async (context) => {
      countRun('check');
      if (control.corruptGatherOnce) {
        control.corruptGatherOnce = false;
        // A deploy changed the checkpoint's schema: the stored one no longer validates.
        await harness.firestore.db.doc(`${JOBS}/${context.jobId}/checkpoints/gather`).update({ state: { total: 'not a number' } });
        for (const unit of control.corruptUnits) await harness.firestore.db.doc(`${JOBS}/${context.jobId}/units/gather~${unit}`).update({ result: { value: 'stale shape' } });
        throw new RetryableError('checkpoint schema changed under the job');
      }
      return { kind: 'done', state: { ok: context.checkpoint(gather).total >= 0 } };
    },
  });

  const fanOutPipeline = definePipeline<Input>({
    name: 'gather-check',
    description: 'Test pipeline: a fan-out (possibly of zero units), then a plain phase',
    input,
    phases: [gather, check],
    publish: (context) => ({ outcome: 'complete', title: 'Gathered', markdown: `total ${context.checkpoint(gather).total}`, missing: [] }),
  });

  /** Two fan-out phases that use the same unit IDs; `schema` picks whether their unit results share a shape. */
  function twoFanOuts(name: string, sameSchema: boolean) {
    const first = defineFanOutPhase<Input, { n: number }, { value: number }>({
      name: 'first',
      state: z.strictObject({ n: z.number() }),
      fanOut: {
        units: () => ['a', 'b'],
        unitState: z.strictObject({ value: z.number() }),
        runUnit: (context, unit) => {
          countRun(`first/${unit}`);
          context.addCost({ usd: 1 });
          return Promise.resolve({ kind: 'done', state: { value: 1 } });
        },
        join: (results) => ({ n: results.size }),
      },
    });
    const second = defineFanOutPhase<Input, { n: number }, { value: number } | { label: string }>({
      name: 'second',
      state: z.strictObject({ n: z.number() }),
      fanOut: {
        units: () => ['a', 'b'],
        unitState: sameSchema ? z.strictObject({ value: z.number() }) : z.strictObject({ label: z.string() }),
        runUnit: (context, unit) => {
          countRun(`second/${unit}`);
          context.addCost({ usd: 1 });
          return Promise.resolve({ kind: 'done', state: sameSchema ? { value: 10 } : { label: unit } });
        },
        join: (results) => ({ n: results.size }),
      },
    });
    return definePipeline<Input>({
      name,
      description: 'Test pipeline: two fan-out phases with the same unit IDs',
      input,
      phases: [first, second],
      publish: () => ({ outcome: 'complete', title: 'Two fan-outs', markdown: 'done', missing: [] }),
    });
  }

  /** Five plain phases; each may be told to die a number of times before it finishes. */
  const fivePhases = definePipeline<Input>({
    name: 'five-phases',
    description: 'Test pipeline: five phases in a row',
    input,
    phases: ['p1', 'p2', 'p3', 'p4', 'p5'].map((name) =>
      definePhase<Input, { done: boolean }>({
        name,
        state: z.strictObject({ done: z.boolean() }),
        run: async () => {
          countRun(name);
          await maybeDie(name);
          return { kind: 'done', state: { done: true } };
        },
      }),
    ),
    publish: () => ({ outcome: 'complete', title: 'Five', markdown: 'done', missing: [] }),
  });

  /** One sectioned phase: each run records the next of five sections, unless it dies before. */
  const sectioned = definePipeline<Input>({
    name: 'sectioned',
    description: 'Test pipeline: sections recorded one per run',
    input,
    phases: [
      definePhase<Input, { sections: number }>({
        name: 'write',
        state: z.strictObject({ sections: z.number() }),
        section: z.strictObject({ index: z.number() }),
        run: async (context) => {
          const next = context.sections().length;
          if (next === 5) return { kind: 'done', state: { sections: 5 } };
          countRun(`write/s${next}`);
          await maybeDie(`write/s${next}`);
          await context.recordSection(`s${next}`, { index: next });
          await maybeDie(`write/after-s${next}`);
          return { kind: 'yield' };
        },
      }),
    ],
    publish: () => ({ outcome: 'complete', title: 'Sectioned', markdown: 'done', missing: [] }),
  });

  /** A phase that throws the queued errors one per run, then finishes; or returns a given wait. */
  const flaky = definePipeline<Input>({
    name: 'flaky',
    description: 'Test pipeline: errors and waits on demand',
    input,
    phases: [
      definePhase<Input, { ok: boolean }>({
        name: 'flaky',
        state: z.strictObject({ ok: z.boolean() }),
        run: (_context: StepContext<Input>) => {
          countRun('flaky');
          const error = control.errors.shift();
          if (error) throw error;
          if (control.waitOutcome) {
            const outcome = control.waitOutcome;
            control.waitOutcome = null;
            return Promise.resolve(outcome);
          }
          return Promise.resolve({ kind: 'done', state: { ok: true } });
        },
      }),
    ],
    publish: () => ({ outcome: 'complete', title: 'Flaky', markdown: 'done', missing: [] }),
  });

  const harness = engineSuite('engine-holes', pipelineRegistry(fanOutPipeline, twoFanOuts('same-schema', true), twoFanOuts('other-schema', false), fivePhases, sectioned, flaky), {
    beforeEach: () => {
      resetControl();
    },
  });

  const db = () => harness.firestore.db;
  const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
  const readUnits = async (jobId: string): Promise<UnitRecord[]> => (await db().collection(`${JOBS}/${jobId}/units`).get()).docs.map((doc) => decodeUnit(doc.ref.path, doc.data()));
  const eventKinds = (jobId: string) => harness.eventKinds(jobId);

  async function stranded(jobId: string): Promise<string | null> {
    const units: UnitView[] = await readUnits(jobId);
    return strandedReason(await readJob(jobId), units);
  }

  /** Waits (in real time, briefly) until a step that will never finish has made its writes. */
  async function until(probe: () => Promise<boolean>): Promise<void> {
    for (let tries = 0; tries < 4_000; tries += 1) {
      if (await probe()) return;
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    throw new Error('condition never held');
  }

  /** A queue whose enqueue number `dieAt` (1-based) never returns: the worker died right there. */
  class DyingQueue implements TaskQueuePort {
    calls = 0;
    constructor(private readonly dieAt: number) {}
    enqueue(task: StepTask, options: { readonly id: string; readonly delaySeconds?: number }): Promise<void> {
      this.calls += 1;
      if (this.calls === this.dieAt) return hangForever();
      return harness.queue.enqueue(task, options);
    }
  }

  /** Moves time on and sweeps until the job ends (or gives up), draining every task on the way. */
  async function sweepAndDrainToEnd(jobId: string, rounds = 8): Promise<void> {
    for (let round = 0; round < rounds; round += 1) {
      await harness.drain();
      const job = await readJob(jobId);
      if (['completed', 'failed', 'cancelled', 'quarantined'].includes(job.status)) return;
      expect(await stranded(jobId)).toBeNull();
      harness.clock.advance((harness.options.leaseSeconds + harness.options.lostTaskGraceSeconds + 1) * 1000);
      await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
    }
  }

  /** Runs the next queued task with a worker that dies where the test set it to. */
  function runDoomed(queue: TaskQueuePort): void {
    const next = harness.queue.tasks.shift();
    if (!next) throw new Error('no task to run');
    harness.clock.advance(next.delaySeconds * 1000);
    void runStep(harness.deps('doomed', { queue }), next.task);
  }

  describe('bug 1: no job is left running without a lease and without a live unit', () => {
    test('bug 1: a fan-out of zero units joins in the commit that starts it', async () => {
      const jobId = await harness.submit('gather-check', { units: 0 });
      const outcomes = await harness.drain();
      expect(outcomes.map((outcome) => outcome.kind)).toEqual(['fanned-out', 'handed-off', 'completed']);
      expect(await readJob(jobId)).toMatchObject({ status: 'completed' });
      expect(await eventKinds(jobId)).toContain('joined');
    });

    test('bug 1: a coordinator killed after the zero-unit fan-out commit leaves a queued job the sweeper re-dispatches', async () => {
      const jobId = await harness.submit('gather-check', { units: 0 });
      runDoomed(new DyingQueue(1));
      await until(async () => (await readJob(jobId)).step === 1);
      expect(await stranded(jobId)).toBeNull();
      expect(await readJob(jobId)).toMatchObject({ status: 'queued', fanout: null, lease: null });
      await sweepAndDrainToEnd(jobId);
      expect(await readJob(jobId)).toMatchObject({ status: 'completed' });
    });

    test('bug 1: every unit reused after a refused checkpoint: the restart joins at once, and a kill after that commit strands nothing', async () => {
      control.corruptGatherOnce = true;
      const jobId = await harness.submit('gather-check', { units: 2 });
      // gather fans out, both units finish and join; check corrupts the checkpoint and fails once.
      await harness.drain(4);
      const failed = await readJob(jobId);
      expect(failed).toMatchObject({ status: 'queued', attempts: 1 });
      // The next claim refuses the checkpoint and starts gather again: both units are reused.
      runDoomed(new DyingQueue(1));
      await until(async () => (await readJob(jobId)).step === failed.step + 1);
      expect(await readJob(jobId)).toMatchObject({ status: 'queued', fanout: null, lease: null, attempts: 0 });
      expect(await stranded(jobId)).toBeNull();
      await sweepAndDrainToEnd(jobId);
      const job = await readJob(jobId);
      expect(job).toMatchObject({ status: 'completed' });
      expect(control.runs.get('gather/u0')).toBe(1);
      expect(control.runs.get('gather/u1')).toBe(1);
      expect(job.cost.usd).toBe(2);
    });

    test.each([
      ['before the fan-out commit (while listing units is slow to die)', 0],
      ['after the commit, before any unit task is enqueued', 1],
      ['after the first unit task is enqueued', 2],
      ['after the second unit task is enqueued', 3],
    ])('bug 1: a coordinator killed %s: every moment satisfies the invariant and the job completes', async (_label, dieAt) => {
      const jobId = await harness.submit('gather-check', { units: 3 });
      if (dieAt === 0) {
        // The worker dies holding its lease: nothing was committed.
        const next = harness.queue.tasks.shift();
        const doomedStore = new (class extends JobStore {
          // Every commit of the claim's holder hangs; the claim itself lands.
          override apply: JobStore['apply'] = (owner, decide) => (owner.kind === 'job' ? hangForever() : super.apply(owner, decide));
        })(harness.firestore.db, harness.clock, harness.options);
        void runStep({ ...harness.deps('doomed'), store: doomedStore }, next!.task);
        await until(async () => (await readJob(jobId)).status === 'running');
      } else {
        runDoomed(new DyingQueue(dieAt));
        await until(async () => (await readJob(jobId)).fanout !== null);
      }
      expect(await stranded(jobId)).toBeNull();
      await sweepAndDrainToEnd(jobId);
      expect(await readJob(jobId)).toMatchObject({ status: 'completed' });
      expect(await stranded(jobId)).toBeNull();
    });
  });

  describe('bug 5: units are keyed by phase and each unit is counted once', () => {
    test('bug 5: two fan-out phases with the same unit IDs each run their own units', async () => {
      const jobId = await harness.submit('same-schema', { units: 0 });
      await harness.drain();
      expect(await readJob(jobId)).toMatchObject({ status: 'completed' });
      expect(Object.fromEntries(control.runs)).toEqual({ 'first/a': 1, 'first/b': 1, 'second/a': 1, 'second/b': 1 });
      expect((await readUnits(jobId)).map((unit) => `${unit.phase}/${unit.unit}`).sort()).toEqual(['first/a', 'first/b', 'second/a', 'second/b']);
    });

    test('bug 5: a finished unit whose result stops validating is re-run, and only its new spending is added', async () => {
      control.corruptGatherOnce = true;
      control.corruptUnits = ['u0'];
      const jobId = await harness.submit('gather-check', { units: 2 });
      await sweepAndDrainToEnd(jobId);
      const job = await readJob(jobId);
      expect(job.status).toBe('completed');
      expect(Object.fromEntries(control.runs)).toMatchObject({ 'gather/u0': 2, 'gather/u1': 1 });
      // Three unit runs at 1 USD each: u0 twice, u1 once.
      expect(job.cost.usd).toBe(3);
    });

    test('bug 5: with another unit schema, the cost of each unit is counted once', async () => {
      const jobId = await harness.submit('other-schema', { units: 0 });
      await harness.drain();
      const job = await readJob(jobId);
      expect(job.status).toBe('completed');
      expect(job.cost.usd).toBe(4);
    });
  });

  describe('bug 8: poison means dying repeatedly without progress', () => {
    /** Runs the next task with a worker that dies once `dead` holds, then lets its lease expire and sweeps. */
    async function loseWorkerOnce(dead: () => Promise<boolean>): Promise<void> {
      const next = harness.queue.tasks.shift();
      if (!next) throw new Error('no task to run');
      void runStep(harness.deps('doomed'), next.task);
      await until(dead);
      harness.clock.advance((harness.options.leaseSeconds + 1) * 1000);
      const report = await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
      expect(report.reclaimed + report.quarantined).toBe(1);
    }

    test('bug 8: five workers lost over five phases, each phase finishing after its loss: the job completes', async () => {
      const phases = ['p1', 'p2', 'p3', 'p4', 'p5'];
      for (const phase of phases) control.deaths.set(phase, 1);
      const jobId = await harness.submit('five-phases', { units: 0 });
      for (const phase of phases) {
        await loseWorkerOnce(() => Promise.resolve(control.deaths.get(phase) === 0));
        await harness.drain(1); // the phase finishes on its next worker
      }
      await harness.drain();
      expect(await readJob(jobId)).toMatchObject({ status: 'completed', staleReclaims: 0 });
      expect((await eventKinds(jobId)).filter((kind) => kind === 'reclaimed')).toHaveLength(5);
    });

    test('bug 8: five workers lost, each right after recording a new section: progress every time, the job completes', async () => {
      for (let index = 0; index < 5; index += 1) control.deaths.set(`write/after-s${index}`, 1);
      const jobId = await harness.submit('sectioned', { units: 0 });
      for (let index = 0; index < 5; index += 1) await loseWorkerOnce(() => Promise.resolve(control.deaths.get(`write/after-s${index}`) === 0));
      await harness.drain();
      expect(await readJob(jobId)).toMatchObject({ status: 'completed' });
    });

    test('bug 8: four workers lost in the same section: quarantined as poison', async () => {
      control.deaths.set('write/s2', 4);
      const jobId = await harness.submit('sectioned', { units: 0 });
      await harness.drain(2); // s0 and s1 recorded, one step each
      for (let death = 1; death <= 4; death += 1) await loseWorkerOnce(() => Promise.resolve(control.deaths.get('write/s2') === 4 - death));
      const job = await readJob(jobId);
      expect(job).toMatchObject({ status: 'quarantined', staleReclaims: 4 });
      expect(job.quarantine?.reason).toMatch(/expired 4 times/);
    });
  });

  describe('bug 4 (engine): a server-given delay past the cap is an outage with a stated resume time', () => {
    test.each([
      ['a day', 86_400_000],
      ['10^15 ms', 1e15],
      ['Infinity', Number.POSITIVE_INFINITY],
    ])('bug 4: Retry-After of %s parks the job for the cap only, as one attempt', async (_label, retryAfterMs) => {
      control.errors = [new RetryableError('provider: 429 rate limited', { code: 'rate_limited', retryAfterMs })];
      const jobId = await harness.submit('flaky', { units: 0 });
      const [outcome] = await harness.drain(1);
      expect(outcome).toEqual({ kind: 'waiting', reason: 'provider' });
      const job = await readJob(jobId);
      const capMs = harness.options.maxServerDelaySeconds * 1000;
      expect(job).toMatchObject({ status: 'waiting', attempts: 1, lease: null });
      expect(job.waiting?.untilMs).toBe(harness.clock.now() + capMs);
      expect(job.waiting?.question).toContain(new Date(harness.clock.now() + capMs).toISOString());
      expect(await stranded(jobId)).toBeNull();
      harness.clock.advance(capMs);
      expect((await sweep({ store: harness.store, queue: harness.queue }, harness.clock.now())).resumed).toBe(1);
      await harness.drain();
      expect(await readJob(jobId)).toMatchObject({ status: 'completed' });
    });

    test('bug 4: a service that always answers with a day-long Retry-After ends the job failed once the attempts are spent', async () => {
      control.errors = Array.from({ length: 10 }, () => new RetryableError('provider: 429 daily quota', { code: 'rate_limited', retryAfterMs: 86_400_000 }));
      const jobId = await harness.submit('flaky', { units: 0 });
      for (let wait = 1; wait < harness.options.maxAttempts; wait += 1) {
        await harness.drain(1);
        expect(await readJob(jobId)).toMatchObject({ status: 'waiting', attempts: wait });
        harness.clock.advance(harness.options.maxServerDelaySeconds * 1000);
        await sweep({ store: harness.store, queue: harness.queue }, harness.clock.now());
      }
      await harness.drain(1);
      const job = await readJob(jobId);
      expect(job).toMatchObject({ status: 'failed', attempts: harness.options.maxAttempts });
      expect(job.lastError?.message).toContain('daily quota');
    });

    test('bug 4: a Retry-After within the cap is honoured as the backoff', async () => {
      control.errors = [new RetryableError('provider: 429 rate limited', { code: 'rate_limited', retryAfterMs: 120_000 })];
      const jobId = await harness.submit('flaky', { units: 0 });
      const [outcome] = await harness.drain(1);
      expect(outcome).toMatchObject({ kind: 'requeued', attempts: 1 });
      expect((outcome as Extract<StepOutcome, { kind: 'requeued' }>).delayMs).toBeGreaterThanOrEqual(120_000);
      expect((await readJob(jobId)).status).toBe('queued');
    });
  });

  describe('bug 9: the wait contract holds by construction', () => {
    test('bug 9: a provider wait without a resume time fails the job with the reason instead of waiting forever', async () => {
      control.waitOutcome = { kind: 'wait', reason: 'provider', questionId: 'provider', question: 'down' } as unknown as PhaseOutcome<{ ok: boolean }>;
      const jobId = await harness.submit('flaky', { units: 0 });
      await harness.drain();
      const job = await readJob(jobId);
      expect(job.status).toBe('failed');
      expect(job.lastError?.message).toMatch(/provider wait .* needs a finite resume time/);
    });

    test('bug 9: a decision wait given a resume time fails the job instead of timing out into a default', async () => {
      control.waitOutcome = { kind: 'wait', reason: 'decision', questionId: 'q1', question: 'Go on?', options: ['yes', 'no'], untilMs: 5 } as unknown as PhaseOutcome<{ ok: boolean }>;
      const jobId = await harness.submit('flaky', { units: 0 });
      await harness.drain();
      const job = await readJob(jobId);
      expect(job.status).toBe('failed');
      expect(job.lastError?.message).toMatch(/decision wait .* cannot carry a resume time/);
    });

    test('bug 9: a decision wait is stored without a resume time and the sweeper never resumes it', async () => {
      control.waitOutcome = { kind: 'wait', reason: 'decision', questionId: 'q1', question: 'Go on?', options: ['yes', 'no'] };
      const jobId = await harness.submit('flaky', { units: 0 });
      await harness.drain();
      expect((await readJob(jobId)).waiting).toMatchObject({ reason: 'decision', untilMs: null });
      harness.clock.advance(365 * 86_400_000);
      expect((await sweep({ store: harness.store, queue: harness.queue }, harness.clock.now())).resumed).toBe(0);
      expect((await readJob(jobId)).status).toBe('waiting');
    });
  });

  describe('bug 10: timeline events never overwrite each other', () => {
    test('bug 10: two unit commits in the same millisecond keep both events', async () => {
      const jobId = await harness.submit('gather-check', { units: 1 });
      const job = await readJob(jobId);
      const nowMs = harness.clock.now();
      await db().doc(`${JOBS}/${jobId}`).set(encodeJob({ ...job, status: 'running', epoch: 1, lease: null, fanout: { phase: 'gather', epoch: 1, units: 1, done: 0 } }));
      const unit = unitRecord({ jobId, unit: 'u0', phase: 'gather', fanoutEpoch: 1, status: 'running', epoch: 2, lease: { epoch: 2, worker: 'w', expiresAtMs: nowMs + 60_000 }, nextRunAtMs: nowMs, updatedAtMs: nowMs });
      await harness.store.unitRef(jobId, 'gather', 'u0').set(encodeUnit(unit));
      const claim = { jobId, phase: 'gather', unit: 'u0', epoch: 2, fanoutEpoch: 1 };
      // The clock does not move between the two commits.
      await harness.store.asUnitOwner(claim, () => Promise.resolve({ events: [{ kind: 'note', message: 'first' }], value: undefined }));
      await harness.store.asUnitOwner(claim, () => Promise.resolve({ events: [{ kind: 'note', message: 'second' }], value: undefined }));
      const notes = (await db().collection(`${JOBS}/${jobId}/events`).where('kind', '==', 'note').get()).docs.map((doc) => doc.get('message') as string);
      expect(notes.sort()).toEqual(['first', 'second']);
    });
  });

  describe('bug 12: cost is counted once even when a committed write is run again', () => {
    test('bug 12: progress writes that commit and are then re-run (a transient error after commit) do not double the cost', async () => {
      const timers = new ManualTimers();
      /** Runs every owner write twice while `doubling` is on, as a retried transaction would after an unseen commit. */
      class RerunningStore extends JobStore {
        doubling = false;
        override async retryingWrite<T>(what: string, write: () => Promise<T>): Promise<T> {
          if (this.doubling && what.startsWith('job ')) await super.retryingWrite(what, write);
          return super.retryingWrite(what, write);
        }
      }
      const store = new RerunningStore(harness.firestore.db, harness.clock, harness.options);
      control.errors = [];
      const spend = definePipeline<Input>({
        name: 'spend',
        description: 'Test pipeline: spends in three flushed steps',
        input,
        phases: [
          definePhase<Input, { ok: boolean }>({
            name: 'spend',
            state: z.strictObject({ ok: z.boolean() }),
            run: async (context) => {
              store.doubling = true;
              for (let round = 1; round <= 3; round += 1) {
                context.addCost({ usd: 1 });
                context.note('spent', `round ${round}`);
                timers.fireAll();
                // At least this round is written (a doubled count shows as more, and fails below at once).
                await until(async () => ((await readJob(context.jobId)).cost.usd ?? 0) >= round);
                expect((await readJob(context.jobId)).cost.usd).toBe(round);
                harness.clock.advance(2_000);
              }
              store.doubling = false;
              return { kind: 'done', state: { ok: true } };
            },
          }),
        ],
        publish: () => ({ outcome: 'complete', title: 'Spent', markdown: 'done', missing: [] }),
      });
      const jobId = await harness.submit('spend', { units: 0 });
      const next = harness.queue.tasks.shift();
      const outcome = await runStep({ ...harness.deps('spender', { timers }), store, pipelines: pipelineRegistry(spend) }, next!.task);
      expect(outcome.kind).toBe('handed-off');
      const job = await readJob(jobId);
      expect(job.cost.usd).toBe(3);
      expect((await eventKinds(jobId)).filter((kind) => kind === 'spent')).toHaveLength(3);
    });
  });

  test('the invariant checker itself flags the states bug 1 describes', async () => {
    const jobId = await harness.submit('gather-check', { units: 0 });
    const job = await readJob(jobId);
    await db().doc(`${JOBS}/${jobId}`).set(encodeJob({ ...job, status: 'running', epoch: 1, lease: null, fanout: { phase: 'gather', epoch: 1, units: 0, done: 0 } }));
    expect(await stranded(jobId)).toMatch(/no queued or leased unit/);
    await db().doc(`${JOBS}/${jobId}`).update({ fanout: null });
    expect(await stranded(jobId)).toMatch(/neither a lease nor a fan-out/);
    await db().doc(`${JOBS}/${jobId}`).update({ lease: { epoch: 1, worker: 'w', expiresAt: Timestamp.fromMillis(harness.clock.now()) } });
    expect(await stranded(jobId)).toBeNull();
  });
});

/**
 * A unit's finish is a read and a batch conditioned on the job: when every unit of a fan-out
 * finishes at once, each round of commits lands one of them, and the others read again (after a
 * short random pause) until theirs lands. None gives up, and the fan-out joins once.
 */
describe('many units finishing at once', () => {
  const UNITS = 16;
  const instant = unitsPipeline('instant-units', () => Promise.resolve({ kind: 'done', state: { value: 1 } }), {
    phase: 'count',
    maxUnits: 50,
    description: 'Test pipeline: units that finish at once',
    unitIds: (count) => Array.from({ length: count }, (_, index) => `u${String(index).padStart(2, '0')}`),
  });

  const harness = engineSuite('fanout-many-finishers', pipelineRegistry(instant));

  test(`${UNITS} units finishing at once: every finish lands and the fan-out joins once`, async () => {
    const jobId = await harness.submit('instant-units', { units: UNITS });
    expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['fanned-out']);
    const tasks = harness.queue.drain();
    expect(tasks).toHaveLength(UNITS);
    const outcomes = await Promise.all(
      tasks.map((recorded, index) =>
        runStep(harness.deps(`w${index}`), recorded.task).then(
          (outcome) => outcome.kind,
          (error: unknown) => `threw ${(error as Error).constructor.name}: ${(error as Error).message.slice(0, 120)}`,
        ),
      ),
    );
    const units = (await harness.firestore.db.collection(`${JOBS}/${jobId}/units`).get()).docs.map((doc) => doc.get('status') as string);
    const joined = (await harness.firestore.db.collection(`${JOBS}/${jobId}/events`).where('kind', '==', 'joined').get()).size;
    expect(units).toEqual(Array.from({ length: UNITS }, () => 'done'));
    expect(outcomes.every((kind) => kind === 'unit-done')).toBe(true);
    expect(joined).toBe(1);
  });
});
