/**
 * Commits that land while their answer is lost (the client sees UNAVAILABLE and tries again): the
 * writer must find out that its commit is in and go on from it. A claim must not turn into a lost
 * worker at its redelivery, and a hand-off, a fan-out start or a join must still dispatch what it
 * started, not leave it to the sweeper minutes later.
 */
import { stepTaskId } from '../../functions/src/core/job';
import { pipelineRegistry, type PhaseOutcome } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import type { StepTask } from '../../functions/src/core/job';
import { decodeJob } from '../../functions/src/store/codec';
import { JOBS } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';
import { losingCommitAnswers, type LostCommitAnswers } from '../support/failures';
import { heldUnitsPipeline, unitFinished } from '../support/held-units';
import { behaviour, testPipeline } from '../support/test-pipeline';

const held = heldUnitsPipeline('lost-answer-units');
let answers: LostCommitAnswers;

const harness = engineSuite('lost-answers', pipelineRegistry(testPipeline, held.pipeline), {
  beforeEach: () => {
    held.turns.reset();
    answers = losingCommitAnswers(harness.firestore.db);
  },
  afterEach: () => answers.restore(),
});

const db = () => harness.firestore.db;
const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
const eventKinds = async (jobId: string) => (await db().collection(`${JOBS}/${jobId}/events`).orderBy('atMs').get()).docs.map((doc) => doc.get('kind') as string);
const kinds = (outcomes: readonly StepOutcome[]) => outcomes.map((outcome) => outcome.kind);

/** One task as Cloud Tasks delivers it: an answer "not yet due" is delivered again once that time has passed (a few times at most). */
async function deliver(task: StepTask): Promise<StepOutcome[]> {
  const outcomes: StepOutcome[] = [];
  for (let delivery = 0; delivery < 4; delivery += 1) {
    const outcome = await runStep(harness.deps(`worker-${delivery}`), task);
    outcomes.push(outcome);
    if (outcome.kind !== 'not-yet-due') return outcomes;
    harness.clock.advance(outcome.retryAfterMs);
  }
  return outcomes;
}

function nextTask(): StepTask {
  const next = harness.queue.tasks.shift();
  if (!next) throw new Error('no task was dispatched');
  harness.clock.advance(next.delaySeconds * 1000);
  return next.task;
}

describe('a claim whose answer is lost', () => {
  test('bug 27: the step goes on under the claim it made; four in one section count no lost worker and do not quarantine the job', async () => {
    let firstRuns = 0;
    behaviour.first = (context): Promise<PhaseOutcome<{ sections: number }>> => {
      firstRuns += 1;
      return Promise.resolve(firstRuns <= 4 ? { kind: 'yield' } : { kind: 'done', state: { sections: context.input.sections } });
    };
    const jobId = await harness.submit('two-phase', { sections: 1 });
    const deliveries: string[][] = [];
    for (let step = 0; step < 4; step += 1) {
      answers.arm(1); // the claim is the step's first commit
      deliveries.push(kinds(await deliver(nextTask())));
    }
    expect(answers.lost()).toBe(4);
    const afterFour = await readJob(jobId);
    expect({ deliveries, status: afterFour.status, staleReclaims: afterFour.staleReclaims }).toEqual({
      deliveries: [['handed-off'], ['handed-off'], ['handed-off'], ['handed-off']],
      status: 'queued',
      staleReclaims: 0,
    });
    expect(kinds(await harness.drain())).toEqual(['handed-off', 'handed-off', 'completed']);
    expect((await eventKinds(jobId)).filter((kind) => kind === 'reclaimed' || kind === 'quarantined')).toEqual([]);
  });

  test("bug 27: a unit's claim: the unit runs under the claim it made and counts no lost worker", async () => {
    const jobId = await harness.submit('lost-answer-units', { units: 1 });
    expect(kinds(await harness.drain(1))).toEqual(['fanned-out']);
    answers.arm(1);
    const unitTask = nextTask();
    expect(kinds(await deliver(unitTask))).toEqual(['unit-done']);
    expect(answers.lost()).toBe(1);
    expect(kinds(await harness.drain())).toEqual(['completed']);
    expect((await eventKinds(jobId)).filter((kind) => kind === 'reclaimed' || kind === 'quarantined')).toEqual([]);
    const units = await db().collection(`${JOBS}/${jobId}/units`).get();
    expect(units.docs.map((doc) => doc.get('staleReclaims') as unknown)).toEqual([0]);
  });
});

describe('a commit that starts the next task, whose answer is lost', () => {
  test('bug 27: a hand-off still dispatches the next step (no wait for the sweeper)', async () => {
    behaviour.first = (context) => {
      answers.arm(1); // the hand-off is the next commit of this step
      return Promise.resolve({ kind: 'done', state: { sections: context.input.sections } });
    };
    const jobId = await harness.submit('two-phase', { sections: 1 });
    expect(kinds(await deliver(nextTask()))).toEqual(['handed-off']);
    expect(answers.lost()).toBe(1);
    const job = await readJob(jobId);
    expect(harness.queue.tasks.map((queued) => queued.id)).toEqual([stepTaskId(jobId, job.step, job.dispatch)]);
    expect(kinds(await harness.drain())).toEqual(['handed-off', 'completed']);
  });

  test('bug 27: a fan-out start still dispatches its units', async () => {
    const jobId = await harness.submit('lost-answer-units', { units: 2 });
    answers.arm(2); // the claim, then the fan-out start
    expect(kinds(await deliver(nextTask()))).toEqual(['fanned-out']);
    expect(answers.lost()).toBe(1);
    expect(harness.queue.tasks.map((queued) => queued.task.unit)).toEqual(['u0', 'u1']);
    expect(kinds(await harness.drain())).toEqual(['unit-done', 'unit-done', 'completed']);
    expect((await readJob(jobId)).status).toBe('completed');
  });

  test('bug 27: a join still dispatches the next step', async () => {
    held.turns.run = () => {
      answers.arm(1); // the unit's finishing commit, which joins, is its next commit
      return Promise.resolve(unitFinished);
    };
    const jobId = await harness.submit('lost-answer-units', { units: 1 });
    expect(kinds(await harness.drain(1))).toEqual(['fanned-out']);
    expect(kinds(await deliver(nextTask()))).toEqual(['unit-done']);
    expect(answers.lost()).toBe(1);
    const job = await readJob(jobId);
    expect({ status: job.status, fanout: job.fanout, tasks: harness.queue.tasks.map((queued) => queued.id) }).toEqual({
      status: 'queued',
      fanout: null,
      tasks: [stepTaskId(jobId, job.step, job.dispatch)],
    });
    expect(kinds(await harness.drain())).toEqual(['completed']);
  });
});
