import type { Query, QuerySnapshot } from 'firebase-admin/firestore';
import { RetryableError, TerminalError } from '../../functions/src/core/errors';
import { stepTaskId } from '../../functions/src/core/job';
import { releaseQuarantined } from '../../functions/src/engine/operator';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { sweep } from '../../functions/src/engine/sweeper';
import { decodeJob } from '../../functions/src/store/codec';
import { checkpointPath, JOBS, jobPath, REJECTED_TASKS } from '../../functions/src/store/paths';
import { engineSuite, gate, waitUntil } from '../support/engine';
import { beforeFirstGet } from '../support/interpose';
import { behaviour, recordSections, resetBehaviour, testPipelines } from '../support/test-pipeline';
import { ManualTimers } from '../support/timers';

const harness = engineSuite('runner', testPipelines);

const db = () => harness.firestore.db;
const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
const events = async (jobId: string) => (await db().collection(`${JOBS}/${jobId}/events`).orderBy('atMs').get()).docs.map((doc) => doc.get('kind') as string);

/**
 * What the sweeper does to a job whose lease expired: requeue it for a new step. Committed through
 * the store like every engine write, so the claim's slot is revoked with it.
 */
async function expireAndRequeue(jobId: string): Promise<number> {
  return harness.store.transact(jobId, () => null, ({ job }) => {
    const step = job.step + 1;
    return Promise.resolve({ next: { ...job, status: 'queued' as const, lease: null, step, staleReclaims: job.staleReclaims + 1, nextRunAtMs: harness.clock.now() }, value: step });
  });
}


test('a job runs phase by phase through its tasks, checkpoints, and publishes one result', async () => {
  const jobId = await harness.submit('two-phase', { sections: 3 });
  const outcomes = await harness.drain();

  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['handed-off', 'handed-off', 'completed']);
  const job = await readJob(jobId);
  expect(job).toMatchObject({ status: 'completed', outcome: 'complete', lease: null, epoch: 3, progress: { sectionsDone: 3, sectionsTotal: 3 } });
  const result = await db().doc(`${JOBS}/${jobId}/results/final`).get();
  expect(result.get('markdown')).toBe('total 30');
  expect((await db().collection(`${JOBS}/${jobId}/sections`).get()).size).toBe(3);
  expect(await events(jobId)).toEqual(['submitted', 'claimed', 'checkpointed', 'claimed', 'checkpointed', 'claimed', 'completed']);
});

test('with a conversation, the answer is published as the assistant message of that conversation, once', async () => {
  const jobId = await harness.submit('two-phase', { sections: 2 }, 'user-7', 'chat-1');
  expect((await db().doc('conversations/chat-1').get()).get('owner')).toBe('user-7');
  await harness.drain();
  const message = await db().doc(`conversations/chat-1/messages/${jobId}`).get();
  expect(message.data()).toMatchObject({ role: 'assistant', jobId, owner: 'user-7', outcome: 'complete', markdown: 'total 10', missing: [] });
  expect((await db().collection(`${JOBS}/${jobId}/results`).get()).size).toBe(0);
  // Another user cannot attach a job to that conversation.
  await expect(harness.submit('two-phase', { sections: 1 }, 'user-8', 'chat-1')).rejects.toThrow(/belongs to someone else/);
});

test('ten concurrent claimers of one queued job: exactly one wins; the others find it held with a fresh heartbeat and ask to come back later', async () => {
  const hold = gate();
  let runs = 0;
  behaviour.first = async () => {
    runs += 1;
    await hold.promise; // the winner keeps the job running while the others try
    return { kind: 'done', state: { sections: 1 } };
  };
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const [task] = harness.queue.drain();
  const settled: StepOutcome[] = [];
  const claimers = Array.from({ length: 10 }, (_, index) => runStep(harness.deps(`claimer-${index}`), task!.task).then((outcome) => settled.push(outcome)));
  // The losers' conditioned commits fail at once and they read the job again: they can settle before the winner's phase starts.
  await waitUntil(() => Promise.resolve(settled.length === 9 && runs === 1));

  // Deliveries of the winner's own step: not claimable now, redelivered later in case the winner dies.
  expect(settled.map((outcome) => outcome.kind)).toEqual(Array<string>(9).fill('not-yet-due'));
  expect(runs).toBe(1);
  hold.open();
  await Promise.all(claimers);
  expect(settled.filter((outcome) => outcome.kind === 'handed-off')).toHaveLength(1);
  const job = await readJob(jobId);
  expect(job.epoch).toBe(1);
  expect((await events(jobId)).filter((kind) => kind === 'claimed')).toHaveLength(1);
});

test('fault 6: the same task delivered twice, concurrently and again later: one execution of each durable write, one result', async () => {
  const jobId = await harness.submit('two-phase', { sections: 2 });
  const outcomes: StepOutcome[] = [];
  for (let round = 0; round < 10; round += 1) {
    const tasks = harness.queue.drain();
    if (tasks.length === 0) break;
    for (const recorded of tasks) {
      // Every delivery arrives twice at once, and once more after the fact.
      outcomes.push(...(await Promise.all([runStep(harness.deps('a'), recorded.task), runStep(harness.deps('b'), recorded.task)])));
      outcomes.push(await runStep(harness.deps('c'), recorded.task));
    }
  }
  expect(outcomes.filter((outcome) => outcome.kind === 'completed')).toHaveLength(1);
  expect(behaviour.publishes).toBe(1);
  expect([...behaviour.sectionRuns.values()]).toEqual([1, 1]);
  expect((await readJob(jobId)).status).toBe('completed');
  expect((await db().collection(`${JOBS}/${jobId}/results`).get()).size).toBe(1);
});

describe('fault 2: after a reclaim (the lease expired mid-step), every write of the old owner is refused and the new owner stands', () => {
  async function holdFirstOwner(jobId: string, afterGate: (context: Parameters<typeof behaviour.first>[0]) => Promise<unknown>) {
    const hold = gate();
    const entered = gate();
    let calls = 0;
    behaviour.first = async (context) => {
      calls += 1;
      if (calls === 1) {
        entered.open();
        await hold.promise;
        await afterGate(context);
      }
      return { kind: 'done', state: { sections: 1 } };
    };
    const [task] = harness.queue.drain();
    const oldWorker = runStep(harness.deps('old'), task!.task);
    // Inside its phase, not just claimed: otherwise the new owner could be the first to reach the gate.
    await entered.promise;
    expect((await readJob(jobId)).status).toBe('running');
    const step = await expireAndRequeue(jobId);
    await harness.queue.enqueue({ jobId, step }, { id: stepTaskId(jobId, step, 0) });
    const newOutcomes = await harness.drain();
    expect(newOutcomes.at(-1)?.kind).toBe('completed');
    return { release: hold.open, oldWorker };
  }

  async function expectNewOwnerStands(jobId: string) {
    const job = await readJob(jobId);
    expect(job.status).toBe('completed');
    expect((await db().doc(`${JOBS}/${jobId}/checkpoints/first`).get()).get('epoch')).toBe(2);
    expect((await db().collection(`${JOBS}/${jobId}/results`).get()).size).toBe(1);
    expect(behaviour.publishes).toBe(1);
  }

  test('checkpoint and hand-off', async () => {
    const jobId = await harness.submit('two-phase', { sections: 1 });
    const { release, oldWorker } = await holdFirstOwner(jobId, () => Promise.resolve());
    release();
    expect((await oldWorker).kind).toBe('ownership-lost');
    await expectNewOwnerStands(jobId);
  });

  test('requeue after a retryable error, and fail after a terminal one', async () => {
    for (const error of [new RetryableError('provider wave'), new TerminalError('bad request')]) {
      resetBehaviour();
      await harness.firestore.reset();
      const jobId = await harness.submit('two-phase', { sections: 1 });
      const { release, oldWorker } = await holdFirstOwner(jobId, () => Promise.reject(error));
      release();
      expect((await oldWorker).kind).toBe('ownership-lost');
      await expectNewOwnerStands(jobId);
      expect((await readJob(jobId)).lastError).toBeNull();
    }
  });

  test('section write: refused, and the running step is aborted through its signal', async () => {
    const jobId = await harness.submit('two-phase', { sections: 1 });
    let signalAborted = false;
    const { release, oldWorker } = await holdFirstOwner(jobId, async (context) => {
      await expect(context.recordSection('late', { value: 1 })).rejects.toThrow(/no longer owns/);
      signalAborted = context.signal.aborted;
    });
    release();
    expect((await oldWorker).kind).toBe('ownership-lost');
    expect(signalAborted).toBe(true);
    expect((await db().doc(`${JOBS}/${jobId}/sections/first~-~late`).get()).exists).toBe(false);
    await expectNewOwnerStands(jobId);
  });

  test('heartbeat: refused, and the step is aborted', async () => {
    const timers = new ManualTimers();
    const hold = gate();
    const jobId = await harness.submit('two-phase', { sections: 1 });
    let abortedBy: unknown;
    behaviour.first = async (context) => {
      await hold.promise;
      context.reportProgress({ halfway: 1 });
      timers.fireAll(); // the heartbeat and the progress flush are due
      await new Promise<void>((resolve) => context.signal.addEventListener('abort', () => resolve(), { once: true }));
      abortedBy = context.signal.reason;
      return { kind: 'done', state: { sections: 1 } };
    };
    const [task] = harness.queue.drain();
    const oldWorker = runStep(harness.deps('old', { timers }), task!.task);
    await waitUntil(async () => (await readJob(jobId)).status === 'running');
    await expireAndRequeue(jobId);
    hold.open();
    expect((await oldWorker).kind).toBe('ownership-lost');
    expect(String(abortedBy)).toMatch(/no longer owns/);
    const job = await readJob(jobId);
    expect(job.progress).not.toHaveProperty('halfway');
    expect(job.status).toBe('queued');
  });

  test('fault 5: completion by the old worker after a reclaim: refused, and the new owner publishes once', async () => {
    const jobId = await harness.submit('two-phase', { sections: 1 });
    await harness.drain();
    // Rewind to "the last phase is checkpointed, completion pending" and let an old worker claim it.
    await harness.firestore.db.doc(`${JOBS}/${jobId}/results/final`).delete();
    behaviour.publishes = 0;
    await db().doc(`${JOBS}/${jobId}`).update({ status: 'queued', step: 10, outcome: null, finishedAt: null });
    const claimedByOld = gate();
    const reclaimed = gate();
    const oldStore = Object.create(harness.store) as typeof harness.store;
    let held = false;
    // Completion reads the outbox and the effect ledger, then commits conditioned on the job.
    oldStore.apply = (async (owner, decide) => {
      if (!held && owner.kind === 'job') {
        held = true;
        claimedByOld.open();
        await reclaimed.promise;
      }
      return harness.store.apply(owner, decide);
    });
    const oldWorker = runStep({ ...harness.deps('old'), store: oldStore }, { jobId, step: 10 });
    await claimedByOld.promise;
    const step = await expireAndRequeue(jobId);
    expect((await runStep(harness.deps('new'), { jobId, step })).kind).toBe('completed');
    reclaimed.open();
    expect((await oldWorker).kind).toBe('ownership-lost');
    expect((await readJob(jobId)).status).toBe('completed');
    expect((await db().collection(`${JOBS}/${jobId}/results`).get()).size).toBe(1);
    expect(behaviour.publishes).toBe(2); // computed twice, published once
  });
});

test('a retryable error requeues with backoff until the budget is spent, then fails with the last error; each answer is 2xx', async () => {
  let calls = 0;
  behaviour.first = () => {
    calls += 1;
    return Promise.reject(new RetryableError(`provider wave ${calls}`));
  };
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const outcomes = await harness.drain();

  expect(outcomes.map((outcome) => outcome.kind)).toEqual([...Array<string>(harness.options.maxAttempts - 1).fill('requeued'), 'failed']);
  const job = await readJob(jobId);
  expect(job).toMatchObject({ status: 'failed', attempts: harness.options.maxAttempts, lease: null });
  expect(job.lastError).toMatchObject({ code: 'retryable', message: `provider wave ${harness.options.maxAttempts}`, retryable: true });
  expect((await events(jobId)).filter((kind) => kind === 'retrying')).toHaveLength(harness.options.maxAttempts - 1);
});

test('a retry that comes early is not claimable yet and asks for redelivery', async () => {
  behaviour.first = () => Promise.reject(new RetryableError('slow down', { retryAfterMs: 30_000 }));
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const [first] = harness.queue.drain();
  expect((await runStep(harness.deps(), first!.task)).kind).toBe('requeued');
  const [retry] = harness.queue.drain();
  expect(retry!.delaySeconds).toBeGreaterThanOrEqual(30);
  const early = await runStep(harness.deps(), retry!.task);
  expect(early.kind).toBe('not-yet-due');
  expect((await readJob(jobId)).status).toBe('queued');
});

test('a terminal error fails the job at once', async () => {
  behaviour.first = () => Promise.reject(new TerminalError('the question is not answerable'));
  const jobId = await harness.submit('two-phase', { sections: 1 });
  expect((await harness.drain()).map((outcome) => outcome.kind)).toEqual(['failed']);
  expect((await readJob(jobId)).lastError).toMatchObject({ code: 'terminal', message: 'the question is not answerable', retryable: false });
});

test.each([
  ['not an object', 'hello'],
  ['no job ID', { step: 0 }],
  ['negative step', { jobId: 'abc', step: -1 }],
  ['fractional step', { jobId: 'abc', step: 1.5 }],
  ['path in the job ID', { jobId: '../etc', step: 0 }],
  ['unknown field', { jobId: 'abc', step: 0, extra: true }],
  ['null', null],
])('a malformed task payload (%s) is recorded and acknowledged', async (_label, payload) => {
  const outcome = await runStep(harness.deps(), payload);
  expect(outcome.kind).toBe('rejected');
  const rejected = await db().collection(REJECTED_TASKS).get();
  expect(rejected.size).toBe(1);
  expect(rejected.docs[0]!.get('reason')).toMatch(/Malformed task payload/);
});

test('a task for a job that does not exist is recorded and acknowledged', async () => {
  expect((await runStep(harness.deps(), { jobId: 'missing', step: 0 })).kind).toBe('rejected');
  expect((await db().collection(REJECTED_TASKS).get()).docs[0]!.get('reason')).toMatch(/No such job/);
});

test('fault 3: a checkpoint write that fails after retries stops the step and requeues it; nothing half-written is trusted', async () => {
  const jobId = await harness.submit('two-phase', { sections: 3 });
  await harness.drain(1); // phase one
  // Every write is a batch commit: the section after s0 fails with all its retries (unavailable); the requeue after them lands.
  let failuresLeft = 0;
  const flakyDb = Object.create(harness.store.db) as typeof harness.store.db;
  flakyDb.batch = () => {
    const batch = harness.store.db.batch();
    const commit = batch.commit.bind(batch);
    batch.commit = () => {
      if (failuresLeft === 0) return commit();
      failuresLeft -= 1;
      return Promise.reject(Object.assign(new Error('unavailable'), { code: 14 }));
    };
    return batch;
  };
  const flakyStore = Object.create(harness.store) as typeof harness.store;
  Object.defineProperty(flakyStore, 'db', { value: flakyDb });
  behaviour.second = async (context) => {
    await context.recordSection('s0', { value: 0 });
    failuresLeft = harness.options.writeRetries + 1;
    await context.recordSection('s1', { value: 10 });
    return { kind: 'done', state: { total: -1 } };
  };
  const [task] = harness.queue.drain();
  const outcome = await runStep({ ...harness.deps(), store: flakyStore }, task!.task);

  expect(outcome.kind).toBe('requeued');
  const job = await readJob(jobId);
  expect(job.status).toBe('queued');
  expect(job.lastError?.code).toBe('checkpoint_write_failed');
  const sections = await db().collection(`${JOBS}/${jobId}/sections`).get();
  expect(sections.docs.map((doc) => doc.get('id') as string)).toEqual(['s0']);
  expect((await db().doc(`${JOBS}/${jobId}/checkpoints/second`).get()).exists).toBe(false);

  // The retry resumes after the one durable section and finishes.
  resetBehaviour();
  await harness.drain();
  expect((await readJob(jobId)).status).toBe('completed');
  expect([...behaviour.sectionRuns.keys()]).toEqual(['s1', 's2']);
});

test('a corrupt checkpoint is refused and its phase redone; the resume point in the job is only advisory', async () => {
  const jobId = await harness.submit('two-phase', { sections: 2 });
  await harness.drain(1);
  await db().doc(`${JOBS}/${jobId}/checkpoints/first`).update({ state: { sections: 'many' } });
  let firstRuns = 0;
  behaviour.first = (context) => {
    firstRuns += 1;
    return Promise.resolve({ kind: 'done', state: { sections: context.input.sections } });
  };
  await harness.drain();
  expect(firstRuns).toBe(1);
  expect((await readJob(jobId)).status).toBe('completed');
  const kinds = await events(jobId);
  expect(kinds).toContain('checkpoint-refused');
  expect(kinds).toContain('resumed');
});

test('a phase stops starting sections when most of its step budget is used, and continues in a new step at its first unrecorded section', async () => {
  const budgetMs = harness.options.stepBudgetSeconds * 1000;
  let steps = 0;
  behaviour.second = (context) => {
    steps += 1;
    // Each section takes 45 % of a step's budget on the injected clock.
    return recordSections({
      ...context,
      recordSection: async (id, data) => {
        await context.recordSection(id, data);
        harness.clock.advance(budgetMs * 0.45);
      },
    });
  };
  const jobId = await harness.submit('two-phase', { sections: 5 });
  const outcomes = await harness.drain();

  expect(steps).toBe(3);
  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['handed-off', 'handed-off', 'handed-off', 'handed-off', 'completed']);
  expect(outcomes.filter((outcome) => outcome.kind === 'handed-off' && !outcome.checkpointed)).toHaveLength(2);
  expect([...behaviour.sectionRuns.entries()]).toEqual([['s0', 1], ['s1', 1], ['s2', 1], ['s3', 1], ['s4', 1]]);
  expect((await events(jobId)).filter((kind) => kind === 'yielded')).toHaveLength(2);
  expect((await db().doc(`${JOBS}/${jobId}/results/final`).get()).get('markdown')).toBe('total 100');
});

/** A worker that hangs forever where it stands: no heartbeat (the timers are stopped), no result. */
const hangForever = () => new Promise<never>(() => undefined);

test('a worker that dies mid-phase is reclaimed by the sweeper after its lease; the job resumes from its last checkpoint and no finished section runs again', async () => {
  const jobId = await harness.submit('two-phase', { sections: 4 });
  await harness.drain(1);
  behaviour.second = async (context) => {
    await recordSections({ ...context, shouldYield: () => context.sections().length >= 2 });
    return hangForever();
  };
  const [task] = harness.queue.drain();
  void runStep(harness.deps('doomed'), task!.task);
  await waitUntil(async () => (await db().collection(`${JOBS}/${jobId}/sections`).get()).size === 2);

  // Before the lease runs out the sweeper leaves the job alone; after, it reclaims it.
  harness.clock.advance(harness.options.leaseSeconds * 1000 - 1);
  expect((await sweep({ store: harness.store, queue: harness.queue }, harness.clock.now())).reclaimed).toBe(0);
  harness.clock.advance(2);
  expect((await sweep({ store: harness.store, queue: harness.queue }, harness.clock.now())).reclaimed).toBe(1);

  behaviour.second = recordSections;
  await harness.drain();
  const job = await readJob(jobId);
  // The reclaim was counted, then the checkpoint after it (progress) started the count again.
  expect(job).toMatchObject({ status: 'completed', staleReclaims: 0 });
  expect((await db().collection(`${JOBS}/${jobId}/events`).where('kind', '==', 'reclaimed').get()).size).toBe(1);
  expect([...behaviour.sectionRuns.entries()]).toEqual([['s0', 1], ['s1', 1], ['s2', 1], ['s3', 1]]);
  expect((await db().doc(`${JOBS}/${jobId}/results/final`).get()).get('markdown')).toBe('total 60');
});

test('a job that keeps killing its workers is quarantined after the limit with the reason visible, and an operator can release it', async () => {
  behaviour.first = hangForever;
  const jobId = await harness.submit('two-phase', { sections: 1 });
  for (let death = 1; death <= harness.options.maxStaleReclaims + 1; death += 1) {
    const [task] = harness.queue.drain();
    expect(task).toBeDefined();
    void runStep(harness.deps(`victim-${death}`), task!.task);
    await waitUntil(async () => (await readJob(jobId)).status === 'running');
    harness.clock.advance(harness.options.leaseSeconds * 1000 + 1);
    await sweep({ store: harness.store, queue: harness.queue }, harness.clock.now());
  }
  const quarantined = await readJob(jobId);
  expect(quarantined.status).toBe('quarantined');
  expect(quarantined.quarantine?.reason).toMatch(/lease expired 4 times \(limit 3\)/);
  expect(harness.queue.tasks).toHaveLength(0);

  resetBehaviour();
  await releaseQuarantined(harness.store, harness.queue, jobId, harness.clock.now());
  expect(await readJob(jobId)).toMatchObject({ status: 'queued', staleReclaims: 0, attempts: 0, quarantine: null });
  await harness.drain();
  expect((await readJob(jobId)).status).toBe('completed');
});

test('a job sent round again after it had published completes without publishing a second answer', async () => {
  const jobId = await harness.submit('two-phase', { sections: 1 });
  await harness.drain();
  const first = (await db().doc(`${JOBS}/${jobId}/results/final`).get()).data();
  // As an operator's release of a job that had in fact published would leave it.
  await db().doc(`${JOBS}/${jobId}`).update({ status: 'queued', step: 20, outcome: null, finishedAt: null });
  expect((await runStep(harness.deps(), { jobId, step: 20 })).kind).toBe('completed');
  expect((await db().collection(`${JOBS}/${jobId}/results`).get()).size).toBe(1);
  expect((await db().doc(`${JOBS}/${jobId}/results/final`).get()).data()).toEqual(first);
});

// A claim reads the stored checkpoints beside its commit instead of after it. That is sound only
// because every checkpoint write also rewrites the job under its precondition and the read starts
// after the job was read: a checkpoint that lands before the claim decides is seen by it.
test('a checkpoint that lands just before a claim reads the job is seen by that claim: the finished phase is not run again', async () => {
  const jobId = await harness.submit('two-phase', { sections: 2 });
  let firstRuns = 0;
  const entered = gate();
  const finish = gate();
  behaviour.first = async (context) => {
    firstRuns += 1;
    entered.open();
    await finish.promise;
    return { kind: 'done', state: { sections: context.input.sections } };
  };
  const stepZero = harness.queue.tasks.shift();
  expect(stepZero?.task.step).toBe(0);
  const holder = runStep(harness.deps('holder'), stepZero!.task);
  await entered.promise;

  // Queries sent so far, so that one sent before the job read (which would be the defect) has its answer before the hand-off below.
  const queryPrototype = Object.getPrototypeOf(Object.getPrototypeOf(db().collection('probe'))) as { get: (this: Query) => Promise<QuerySnapshot> };
  const queryGet = queryPrototype.get;
  const queriesSent: Promise<unknown>[] = [];
  const queries = jest.spyOn(queryPrototype, 'get').mockImplementation(function (this: Query) {
    const answer = queryGet.call(this);
    queriesSent.push(answer.catch(() => undefined));
    return answer;
  });
  // The holder finishes the first phase and hands off (checkpoint and job in one commit) right before the next claim reads the job.
  let holderOutcome: StepOutcome | undefined;
  const interposed = beforeFirstGet(db(), jobPath(jobId), async () => {
    await Promise.all(queriesSent);
    finish.open();
    holderOutcome = await holder;
  });
  let claimed: StepOutcome;
  try {
    claimed = await runStep(harness.deps('next'), { jobId, step: 1 });
  } finally {
    interposed.restore();
    queries.mockRestore();
  }
  expect(interposed.ran()).toBe(true);
  expect(holderOutcome).toMatchObject({ kind: 'handed-off', phase: 'first', checkpointed: true });
  expect(claimed).toMatchObject({ kind: 'handed-off', phase: 'second', checkpointed: true });
  expect(firstRuns).toBe(1);
  expect((await db().doc(checkpointPath(jobId, 'second')).get()).exists).toBe(true);

  // The holder's own task for step 1 finds the step taken; the job then publishes once.
  const rest = await harness.drain();
  expect(rest.map((outcome) => outcome.kind)).toEqual(['not-claimable', 'completed']);
  expect(firstRuns).toBe(1);
  expect(behaviour.publishes).toBe(1);
});
