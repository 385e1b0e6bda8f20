/**
 * Bug 14: the fencing epoch, tested where it matters.
 *
 * Each test builds the one interleaving in which only the epoch tells a stale owner from the live
 * one: worker A claims and is held mid-step; its lease runs out on the injected clock and the
 * sweeper reclaims; worker B claims and is held mid-step, so the job (or the fan-out unit) is
 * `running` again; then A makes exactly one owner write. A status check alone would let that
 * write through. It must be refused with OwnershipLostError and leave the database exactly as it
 * was (no section, transcript, checkpoint, ledger entry, outbox, event or field of A's), enqueue
 * nothing, and B must then finish normally. Gates and the manual clock order everything; nothing
 * sleeps.
 */
import { OwnershipLostError, RetryableError, TerminalError } from '../../functions/src/core/errors';
import { pipelineRegistry, type PhaseOutcome, type StepContext, type UnitOutcome } from '../../functions/src/core/pipeline';
import type { EffectIntent } from '../../functions/src/effects/ledger';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { sweep } from '../../functions/src/engine/sweeper';
import { decodeJob, decodeUnit, type UnitRecord } from '../../functions/src/store/codec';
import type { JobStore } from '../../functions/src/store/job-store';
import { JOBS } from '../../functions/src/store/paths';
import { databaseImage } from '../support/database-image';
import { engineSuite } from '../support/engine';
import type { RecordedTask } from '../support/task-queue';
import { behaviour, testPipeline, type TestInput } from '../support/test-pipeline';
import { heldUnitsPipeline, hold, holdThen, unitFinished, type Hold, type UnitInput, type UnitResult } from '../support/held-units';
import { ManualTimers } from '../support/timers';

// ---- A fan-out pipeline whose units the tests hold and release ----------------------------------

const { pipeline: fencedUnits, turns: unitTurns } = heldUnitsPipeline('fenced-units');

const harness = engineSuite('fencing', pipelineRegistry(testPipeline, fencedUnits), {
  beforeEach: () => {
    unitTurns.reset();
  },
});

const db = () => harness.firestore.db;
const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
const kinds = (outcomes: readonly StepOutcome[]) => outcomes.map((outcome) => outcome.kind);

async function readOnlyUnit(jobId: string): Promise<UnitRecord> {
  const docs = (await db().collection(`${JOBS}/${jobId}/units`).get()).docs;
  expect(docs).toHaveLength(1);
  const [doc] = docs;
  if (!doc) throw new Error('no unit');
  return decodeUnit(doc.ref.path, doc.data());
}

function onlyTask(): RecordedTask {
  const tasks = harness.queue.drain();
  expect(tasks).toHaveLength(1);
  const [task] = tasks;
  if (!task) throw new Error('no task was enqueued');
  return task;
}

/** The lease runs out on the clock; one sweep reclaims it and enqueues the task the next owner takes. */
async function expireAndReclaim(counter: 'reclaimed' | 'unitsReclaimed'): Promise<RecordedTask> {
  harness.clock.advance((harness.options.leaseSeconds + 1) * 1000);
  const report = await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
  expect(report[counter]).toBe(1);
  return onlyTask();
}

// ---- Holding workers ----------------------------------------------------------------------------

/**
 * One worker's view of the store: every owner write (job or unit) is recorded with how it ended,
 * and the first one can be held at a gate (a worker stopped just before its completing commit).
 */
class WorkerStore {
  readonly store: JobStore;
  private readonly outcomes: Promise<unknown>[] = [];
  private readonly listeners: ((outcome: Promise<unknown>) => void)[] = [];

  constructor(base: JobStore, holdFirstWrite?: Hold) {
    const store = Object.create(base) as JobStore;
    let pending = holdFirstWrite;
    const track = async <T>(write: () => Promise<T>): Promise<T> => {
      if (pending) {
        const at = pending;
        pending = undefined;
        at.arrive();
        await at.released;
      }
      const result = write();
      const outcome = result.then(
        () => 'committed',
        (error: unknown) => error,
      );
      this.outcomes.push(outcome);
      for (const listener of this.listeners.splice(0)) listener(outcome);
      return result;
    };
    // Every write of a claim holder goes through the door (sections and transcripts as slot-fenced writes); claims do not count.
    store.apply = ((owner, decide) => (owner.kind === 'job-record' || owner.kind === 'unit-record' ? base.apply(owner, decide) : track(() => base.apply(owner, decide))));
    // The effect ledger's moves run in the holder's transaction.
    store.asOwnerReading = (claim, body) => track(() => base.asOwnerReading(claim, body));
    store.asUnitOwner = (claim, body) => track(() => base.asUnitOwner(claim, body));
    this.store = store;
  }

  get count(): number {
    return this.outcomes.length;
  }

  /** How the next owner write this worker starts ends: 'committed', or its error. */
  nextWrite(): Promise<unknown> {
    return new Promise((resolve) => this.listeners.push(resolve));
  }

  /** How each owner write from the `from`-th on ended. */
  settled(from: number): Promise<unknown[]> {
    return Promise.all(this.outcomes.slice(from));
  }
}

// ---- The contest: A held, reclaimed, B claims and is held, A writes once -------------------------

interface OldOwner {
  readonly timers: ManualTimers;
  readonly writes: WorkerStore;
}

interface StaleWrite<TContext, TOutcome> {
  readonly kind: string;
  /** Runs while A still holds its claim, before it is held. */
  readonly prepare?: (context: TContext) => Promise<void>;
  /** A's one owner write, made while B holds the claim mid-step; resolves to how A's step ends. */
  readonly act: (context: TContext, worker: OldOwner) => Promise<TOutcome>;
}

type JobWrite = StaleWrite<StepContext<TestInput>, PhaseOutcome<{ sections: number }>>;
type UnitWrite = StaleWrite<StepContext<UnitInput>, UnitOutcome<UnitResult>>;

interface Contest {
  readonly jobId: string;
  readonly taskOfA: RecordedTask;
  readonly taskOfB: RecordedTask;
}

/** Runs after B holds the claim and before A writes; whatever it does must leave no trace either. */
type Meanwhile = (contest: Contest) => Promise<void>;

const finished = { kind: 'done', state: { sections: 1 } } as const;

/**
 * Gives the phase (or unit) to A on the first claim and to B on the second, each held on its own
 * gate; any later claim (only a broken claim rule makes one) just finishes.
 */
function turns<TContext, TOutcome>(write: StaleWrite<TContext, TOutcome>, oldOwner: OldOwner, holdA: Hold, holdB: Hold, done: TOutcome) {
  let claims = 0;
  return async (context: TContext): Promise<TOutcome> => {
    claims += 1;
    if (claims === 1) {
      await write.prepare?.(context);
      return holdThen(holdA, () => write.act(context, oldOwner));
    }
    if (claims === 2) return holdThen(holdB, () => Promise.resolve(done));
    return done;
  };
}

async function expectStaleWriteRefused(a: Promise<StepOutcome>, holdA: Hold, writesOfA: WorkerStore, meanwhile?: () => Promise<void>): Promise<void> {
  const before = await databaseImage(db());
  await meanwhile?.();
  const from = writesOfA.count;
  holdA.release();
  expect((await a).kind).toBe('ownership-lost');
  const outcomes = await writesOfA.settled(from);
  expect(outcomes).toHaveLength(1);
  expect(outcomes[0]).toBeInstanceOf(OwnershipLostError);
  expect(await databaseImage(db())).toEqual(before);
  expect(harness.queue.tasks).toEqual([]);
}

async function jobContest(write: JobWrite, meanwhile?: Meanwhile): Promise<void> {
  const oldOwner: OldOwner = { timers: new ManualTimers(), writes: new WorkerStore(harness.store) };
  const holdA = hold();
  const holdB = hold();
  behaviour.first = turns(write, oldOwner, holdA, holdB, finished);
  const jobId = await harness.submit('two-phase', { sections: 1 });

  const taskOfA = onlyTask();
  const a = runStep(harness.deps('worker-a', { store: oldOwner.writes.store, timers: oldOwner.timers }), taskOfA.task);
  await holdA.entered;
  expect(await readJob(jobId)).toMatchObject({ status: 'running', epoch: 1 });

  const taskOfB = await expireAndReclaim('reclaimed');
  const b = runStep(harness.deps('worker-b'), taskOfB.task);
  await holdB.entered;
  expect(await readJob(jobId)).toMatchObject({ status: 'running', epoch: 2, lease: { epoch: 2, worker: 'worker-b' } });

  await expectStaleWriteRefused(a, holdA, oldOwner.writes, meanwhile && (() => meanwhile({ jobId, taskOfA, taskOfB })));

  holdB.release();
  expect(await b).toMatchObject({ kind: 'handed-off', phase: 'first', checkpointed: true });
  expect(kinds(await harness.drain())).toEqual(['handed-off', 'completed']);
  expect(await readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete', epoch: 4 });
  expect((await db().doc(`${JOBS}/${jobId}/checkpoints/first`).get()).get('epoch')).toBe(2);
  expect((await db().collection(`${JOBS}/${jobId}/results`).get()).size).toBe(1);
}

async function unitContest(write: UnitWrite, meanwhile?: Meanwhile): Promise<void> {
  const oldOwner: OldOwner = { timers: new ManualTimers(), writes: new WorkerStore(harness.store) };
  const holdA = hold();
  const holdB = hold();
  unitTurns.run = turns(write, oldOwner, holdA, holdB, unitFinished);
  const jobId = await harness.submit('fenced-units', { units: 1 });
  expect(kinds(await harness.drain(1))).toEqual(['fanned-out']);

  const taskOfA = onlyTask();
  const a = runStep(harness.deps('worker-a', { store: oldOwner.writes.store, timers: oldOwner.timers }), taskOfA.task);
  await holdA.entered;
  expect(await readOnlyUnit(jobId)).toMatchObject({ status: 'running', epoch: 1 });

  const taskOfB = await expireAndReclaim('unitsReclaimed');
  const b = runStep(harness.deps('worker-b'), taskOfB.task);
  await holdB.entered;
  expect(await readJob(jobId)).toMatchObject({ status: 'running', epoch: 1, lease: null, fanout: { phase: 'experts', epoch: 1, units: 1, done: 0 } });
  expect(await readOnlyUnit(jobId)).toMatchObject({ status: 'running', epoch: 2, lease: { epoch: 2, worker: 'worker-b' } });

  await expectStaleWriteRefused(a, holdA, oldOwner.writes, meanwhile && (() => meanwhile({ jobId, taskOfA, taskOfB })));

  holdB.release();
  expect(await b).toMatchObject({ kind: 'unit-done', unit: 'u0', joined: true });
  expect(kinds(await harness.drain())).toEqual(['completed']);
  expect(await readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete', fanout: null });
  expect(await readOnlyUnit(jobId)).toMatchObject({ status: 'done', epoch: 2, result: { value: 1 } });
  expect((await db().doc(`${JOBS}/${jobId}/checkpoints/experts`).get()).get('state')).toEqual({ total: 1 });
  expect((await db().collection(`${JOBS}/${jobId}/results`).get()).size).toBe(1);
}

// ---- The owner writes ----------------------------------------------------------------------------

const payment: EffectIntent = { kind: 'payment', identity: 'invoice-14', target: 'acct-1', payload: { cents: 1400 } };

/** Fires the old owner's flush and heartbeat timers and waits for the one write they make. */
async function flushOf(worker: OldOwner): Promise<void> {
  const write = worker.writes.nextWrite();
  worker.timers.fireAll();
  await write;
}

/** The owner writes a phase step or a unit step can make, as one table for both levels. */
function ownerWrites<TInput, TOutcome>(done: TOutcome): StaleWrite<StepContext<TInput>, TOutcome>[] {
  return [
    {
      kind: 'heartbeat',
      act: async (_, worker) => {
        await flushOf(worker);
        return done;
      },
    },
    {
      kind: 'progress, cost and timeline note',
      act: async (context, worker) => {
        context.reportProgress({ staleProgress: 1 });
        context.addCost({ modelCalls: 7 });
        context.note('stale', 'written by the old owner');
        await flushOf(worker);
        return done;
      },
    },
    {
      kind: 'section',
      act: async (context) => {
        await context.recordSection('late', { value: 14 });
        return done;
      },
    },
    {
      kind: 'transcript',
      act: async (context) => {
        await context.saveTranscript('late', { messages: [{ role: 'user', content: 'stale' }] });
        return done;
      },
    },
    {
      // The holder's conditioned commits go without a read once the first has learnt the slot's update time: the precondition alone refuses this one.
      kind: 'section after an earlier one',
      prepare: async (context) => {
        await context.recordSection('early', { value: 13 });
      },
      act: async (context) => {
        await context.recordSection('late', { value: 14 });
        return done;
      },
    },
    {
      kind: 'transcript after an earlier save',
      prepare: async (context) => {
        await context.saveTranscript('late', { messages: [{ role: 'user', content: 'fresh' }] });
      },
      act: async (context) => {
        await context.saveTranscript('late', { messages: [{ role: 'user', content: 'stale' }] });
        return done;
      },
    },
    {
      kind: 'effect ledger: plan',
      act: async (context) => {
        await context.effects.plan([payment]);
        return done;
      },
    },
    {
      kind: 'effect ledger: transition',
      prepare: async (context) => {
        await context.effects.plan([payment]);
      },
      act: async (context) => {
        const [entry] = await context.effects.entries();
        if (!entry) throw new Error('the planned entry is missing');
        await context.effects.transition(entry.key, ['planned'], { state: 'applying', countAttempt: true, lastOutcome: 'sending (stale)' });
        return done;
      },
    },
    { kind: 'requeue after a retryable error', act: () => Promise.reject(new RetryableError('provider wave')) },
    { kind: 'fail after a terminal error', act: () => Promise.reject(new TerminalError('bad request')) },
  ];
}

const jobWrites: JobWrite[] = [
  ...ownerWrites<TestInput, PhaseOutcome<{ sections: number }>>(finished),
  { kind: 'checkpoint and hand-off', act: () => Promise.resolve(finished) },
  { kind: 'hand-off without a checkpoint (yield)', act: () => Promise.resolve({ kind: 'yield' }) },
  { kind: 'wait for a decision', act: () => Promise.resolve({ kind: 'wait', reason: 'decision', questionId: 'q14', question: 'Go on?', options: ['yes', 'no'] }) },
  {
    kind: 'wait for a provider',
    act: (context) => Promise.resolve({ kind: 'wait', reason: 'provider', questionId: 'provider', question: 'The provider is down', untilMs: context.clock.now() + 60_000 }),
  },
];

const unitWrites: UnitWrite[] = [
  ...ownerWrites<UnitInput, UnitOutcome<UnitResult>>(unitFinished),
  { kind: 'unit done, join, fan-out checkpoint and hand-off', act: () => Promise.resolve(unitFinished) },
  { kind: 'unit hand-off to its next step (yield)', act: () => Promise.resolve({ kind: 'yield' }) },
  { kind: 'provider wait for the whole job', act: (context) => Promise.resolve({ kind: 'wait', reason: 'provider', question: 'The provider is down', untilMs: context.clock.now() + 60_000 }) },
];

describe('job level: the old owner writes while the new owner is running mid-step', () => {
  test.each(jobWrites)('bug 14: job, $kind: refused, nothing of it lands, the new owner finishes', (write) => jobContest(write));

  test('bug 14: job, completion and publication: refused, no outbox, the new owner publishes once', async () => {
    const jobId = await harness.submit('two-phase', { sections: 1 });
    expect(kinds(await harness.drain(2))).toEqual(['handed-off', 'handed-off']);
    // Both phases are checkpointed: the next claim goes straight to completion, held before its commit.
    const holdA = hold();
    const holdB = hold();
    const writesOfA = new WorkerStore(harness.store, holdA);
    const writesOfB = new WorkerStore(harness.store, holdB);
    const taskOfA = onlyTask();
    const a = runStep(harness.deps('worker-a', { store: writesOfA.store }), taskOfA.task);
    await holdA.entered;
    expect(await readJob(jobId)).toMatchObject({ status: 'running', epoch: 3 });

    const taskOfB = await expireAndReclaim('reclaimed');
    const b = runStep(harness.deps('worker-b', { store: writesOfB.store }), taskOfB.task);
    await holdB.entered;
    expect(await readJob(jobId)).toMatchObject({ status: 'running', epoch: 4, lease: { epoch: 4, worker: 'worker-b' } });

    await expectStaleWriteRefused(a, holdA, writesOfA);
    expect((await db().collection(`${JOBS}/${jobId}/results`).get()).size).toBe(0);

    holdB.release();
    expect(await b).toMatchObject({ kind: 'completed', outcome: 'complete' });
    expect(await readJob(jobId)).toMatchObject({ status: 'completed', epoch: 4 });
    expect((await db().collection(`${JOBS}/${jobId}/results`).get()).size).toBe(1);
    expect(behaviour.publishes).toBe(2); // computed by both, published by the owner only
  });

  test('bug 14: job, a reclaimed owner writes before anyone claims the job again: refused, nothing lands', async () => {
    const oldOwner: OldOwner = { timers: new ManualTimers(), writes: new WorkerStore(harness.store) };
    const holdA = hold();
    behaviour.first = async (context) => {
      await context.saveTranscript('early', { messages: [{ role: 'user', content: 'fresh' }] });
      return holdThen(holdA, async () => {
        await context.saveTranscript('early', { messages: [{ role: 'user', content: 'stale' }] });
        return finished;
      });
    };
    const jobId = await harness.submit('two-phase', { sections: 1 });
    const a = runStep(harness.deps('worker-a', { store: oldOwner.writes.store, timers: oldOwner.timers }), onlyTask().task);
    await holdA.entered;
    await expireAndReclaim('reclaimed');
    expect(await readJob(jobId)).toMatchObject({ status: 'queued', lease: null });

    const before = await databaseImage(db());
    const from = oldOwner.writes.count;
    holdA.release();
    expect((await a).kind).toBe('ownership-lost');
    const outcomes = await oldOwner.writes.settled(from);
    expect(outcomes[0]).toBeInstanceOf(OwnershipLostError);
    expect(await databaseImage(db())).toEqual(before);
  });

  test('bug 14: job, claim: tasks delivered again while the new owner runs mid-step cannot claim the job', async () => {
    await jobContest({ kind: 'checkpoint and hand-off', act: () => Promise.resolve(finished) }, async ({ taskOfA, taskOfB }) => {
      // B's own step, held with a fresh heartbeat: not claimable now, asked to come back later.
      expect(await runStep(harness.deps('worker-c'), taskOfB.task)).toMatchObject({ kind: 'not-yet-due' });
      expect(await runStep(harness.deps('worker-d'), taskOfA.task)).toMatchObject({ kind: 'not-claimable' });
    });
  });
});

describe('unit level: the old owner of a fan-out unit writes while the new owner is running mid-step', () => {
  test.each(unitWrites)('bug 14: unit, $kind: refused, nothing of it lands, the new owner finishes', (write) => unitContest(write));

  const staleUnitWork: [string, (context: StepContext<UnitInput>) => Promise<UnitOutcome<UnitResult>>][] = [
    [
      'a section',
      async (context) => {
        await context.recordSection('late', { value: 14 });
        return unitFinished;
      },
    ],
    // Through the owner-checked transaction, not the claim slot: only the job's fan-out epoch refuses these.
    ['its completing commit (unit done, join)', () => Promise.resolve(unitFinished)],
    [
      'an effect plan',
      async (context) => {
        await context.effects.plan([payment]);
        return unitFinished;
      },
    ],
  ];
  test.each(staleUnitWork)('bug 14: unit, fan-out epoch: a unit of a fan-out that ended writes %s while the next coordinator is mid-step: refused', async (_, staleWork) => {
    // u1 sends the job to a provider wait, which ends the fan-out while u0's worker is still held.
    // When the job comes back, its new coordinator claims it and is held before it starts the next
    // fan-out: the job is running, u0's document still names u0's claim (same unit epoch, same
    // fan-out epoch), and only the job's fan-out epoch tells u0's worker it is stale.
    const holdA = hold();
    const holdCoordinator = hold();
    const writesOfA = new WorkerStore(harness.store);
    const coordinator = new WorkerStore(harness.store, holdCoordinator);
    const firstRuns = new Set<string>();
    unitTurns.run = (context, unit) => {
      const first = !firstRuns.has(unit);
      firstRuns.add(unit);
      if (first && unit === 'u1') return Promise.resolve({ kind: 'wait', reason: 'provider', question: 'The provider is down', untilMs: context.clock.now() + 1_000 });
      if (first && unit === 'u0') {
        return holdThen(holdA, () => staleWork(context));
      }
      return Promise.resolve(unitFinished);
    };
    const jobId = await harness.submit('fenced-units', { units: 2 });
    expect(kinds(await harness.drain(1))).toEqual(['fanned-out']);
    const unitTasks = harness.queue.drain();
    const taskOf = (unit: string) => {
      const found = unitTasks.find((recorded) => recorded.task.unit === unit);
      if (!found) throw new Error(`no task for ${unit}`);
      return found.task;
    };
    const a = runStep(harness.deps('worker-a', { store: writesOfA.store }), taskOf('u0'));
    await holdA.entered;
    expect(await runStep(harness.deps('worker-u1'), taskOf('u1'))).toMatchObject({ kind: 'waiting', reason: 'provider' });
    expect(await readJob(jobId)).toMatchObject({ status: 'waiting', fanout: null });

    harness.clock.advance(2_000);
    expect((await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now())).resumed).toBe(1);
    const c = runStep(harness.deps('worker-c', { store: coordinator.store }), onlyTask().task);
    await holdCoordinator.entered;
    expect(await readJob(jobId)).toMatchObject({ status: 'running', epoch: 2, fanout: null, lease: { epoch: 2, worker: 'worker-c' } });
    const u0 = (await db().collection(`${JOBS}/${jobId}/units`).get()).docs.map((doc) => decodeUnit(doc.ref.path, doc.data())).find((unit) => unit.unit === 'u0');
    expect(u0).toMatchObject({ status: 'running', epoch: 1, fanoutEpoch: 1, lease: { epoch: 1, worker: 'worker-a' } });

    await expectStaleWriteRefused(a, holdA, writesOfA);

    holdCoordinator.release();
    expect(await c).toMatchObject({ kind: 'fanned-out', units: 2 });
    expect(kinds(await harness.drain())).toEqual(['unit-done', 'unit-done', 'completed']);
    expect(await readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
    expect((await db().doc(`${JOBS}/${jobId}/checkpoints/experts`).get()).get('state')).toEqual({ total: 2 });
  });

  test('bug 14: unit, claim: unit tasks delivered again while the new owner runs mid-step cannot claim the unit', async () => {
    await unitContest({ kind: 'unit done', act: () => Promise.resolve(unitFinished) }, async ({ taskOfA, taskOfB }) => {
      // B's own step, held with a fresh heartbeat: not claimable now, asked to come back later.
      expect(await runStep(harness.deps('worker-c'), taskOfB.task)).toMatchObject({ kind: 'not-yet-due' });
      expect(await runStep(harness.deps('worker-d'), taskOfA.task)).toMatchObject({ kind: 'not-claimable' });
    });
  });
});

/**
 * Every engine write reads its document in the same transaction, and Firestore already refuses a
 * concurrent write there; the update-time precondition is what keeps a commit safe when its
 * snapshot is older than the transaction (the design's "no read on the happy path"). So it is
 * tested where it applies: a commit handed a snapshot that another writer has since overtaken.
 */
describe('the update-time precondition', () => {
  test('bug 14: update time: a job commit from a snapshot another writer overtook is refused', async () => {
    const jobId = await harness.submit('two-phase', { sections: 1 });
    const stale = await harness.store.jobRef(jobId).get();
    expect(kinds(await harness.drain(1))).toEqual(['handed-off']); // a claim and a hand-off commit in between
    const before = await databaseImage(db());
    const job = decodeJob(jobId, stale.data());
    const commit = db().runTransaction((tx) => {
      harness.store.commitJob(tx, stale, job, { ...job, phase: 'written-from-a-stale-snapshot' }, [{ kind: 'stale', message: 'must not land' }]);
      return Promise.resolve();
    });
    await expect(commit).rejects.toMatchObject({ code: 9 }); // FAILED_PRECONDITION
    expect(await databaseImage(db())).toEqual(before);
  });

  test('bug 14: update time: a unit commit from a snapshot another writer overtook is refused', async () => {
    const jobId = await harness.submit('fenced-units', { units: 1 });
    expect(kinds(await harness.drain(1))).toEqual(['fanned-out']);
    const [queuedUnit] = (await db().collection(`${JOBS}/${jobId}/units`).get()).docs;
    if (!queuedUnit) throw new Error('no unit');
    const stale = await queuedUnit.ref.get();
    expect(kinds(await harness.drain())).toEqual(['unit-done', 'completed']);
    const before = await databaseImage(db());
    const commit = db().runTransaction((tx) => {
      harness.store.commitUnit(tx, stale, decodeUnit(stale.ref.path, stale.data()));
      return Promise.resolve();
    });
    await expect(commit).rejects.toMatchObject({ code: 9 });
    expect(await databaseImage(db())).toEqual(before);
    expect(await readOnlyUnit(jobId)).toMatchObject({ status: 'done' });
  });
});
