/**
 * Writes a step leaves behind (engine/step/durable-writes.ts `WritesBehind`): a section the phase
 * records without waiting for it (the research pipeline starts its next section's model call while
 * the record commits) and a final answer's transcript save. The engine keeps them in order before
 * everything that depends on them: the step's settling commit (a hand-off with its checkpoint) waits
 * for them, what the phase reports after them reaches the job only once they landed, and one that
 * fails fails the step: requeued with the error, nothing checkpointed, nothing after it written.
 */
import type { WriteResult } from 'firebase-admin/firestore';
import { JOBS } from '../../functions/src/store/paths';
import { engineSuite, gate } from '../support/engine';
import { aroundCommitsWriting, whileInterposed } from '../support/interpose';
import { behaviour, testPipelines } from '../support/test-pipeline';

// No retries of transient write failures: a failed section write is final at once.
const harness = engineSuite('writes-behind', testPipelines, { options: { writeRetries: 0 } });
const db = () => harness.firestore.db;

const isSection = (path: string): boolean => path.includes('/sections/');
const isCheckpoint = (path: string): boolean => path.includes('/checkpoints/');
const unavailable = (): Error => Object.assign(new Error('14 UNAVAILABLE: injected for the test'), { code: 14 });

/** Submits a job and runs its first phase: the next task runs the sectioned phase. */
async function atSecondPhase(sections = 2): Promise<string> {
  const jobId = await harness.submit('two-phase', { sections });
  const [first] = await harness.drain(1);
  expect(first?.kind).toBe('handed-off');
  return jobId;
}

async function sectionIds(jobId: string): Promise<string[]> {
  return (await db().collection(`${JOBS}/${jobId}/sections`).get()).docs.map((doc) => doc.id).sort();
}

test('sections the phase does not wait for are on record before the step hands off: its checkpoint commit starts after theirs landed', async () => {
  const jobId = await atSecondPhase();
  behaviour.second = (context) => {
    void context.recordSection('s0', { value: 1 });
    void context.recordSection('s1', { value: 2 });
    return Promise.resolve({ kind: 'done', state: { total: context.sections().length } });
  };
  const log: { readonly what: 'start' | 'end'; readonly paths: readonly string[] }[] = [];
  const outcomes = await whileInterposed(
    aroundCommitsWriting(async (paths, commit) => {
      log.push({ what: 'start', paths });
      const results: WriteResult[] = await commit();
      log.push({ what: 'end', paths });
      return results;
    }),
    () => harness.drain(1),
  );
  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['handed-off']);
  expect(await sectionIds(jobId)).toEqual(['second~-~s0', 'second~-~s1']);
  const checkpointStarts = log.findIndex((entry) => entry.what === 'start' && entry.paths.some(isCheckpoint));
  const sectionEnds = log.flatMap((entry, index) => (entry.what === 'end' && entry.paths.some(isSection) ? [index] : []));
  expect(sectionEnds).toHaveLength(2);
  expect(checkpointStarts).toBeGreaterThan(Math.max(...sectionEnds));
  expect((await db().doc(`${JOBS}/${jobId}/checkpoints/second`).get()).get('state')).toEqual({ total: 2 });
});

test('a section write that fails fails the step: the job is requeued with the error, nothing is checkpointed, and the section after it is not written', async () => {
  const jobId = await atSecondPhase();
  behaviour.second = (context) => {
    void context.recordSection('s0', { value: 1 });
    void context.recordSection('s1', { value: 2 });
    return Promise.resolve({ kind: 'done', state: { total: 2 } });
  };
  const refused: string[][] = [];
  const outcomes = await whileInterposed(
    aroundCommitsWriting((paths, commit) => {
      if (!paths.some((path) => path.endsWith('/sections/second~-~s0'))) return commit();
      refused.push([...paths]);
      return Promise.reject(unavailable());
    }),
    () => harness.drain(1),
  );
  expect(refused).toHaveLength(1);
  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['requeued']);
  const job = await harness.readJob(jobId);
  expect(job).toMatchObject({ status: 'queued', phase: 'second', attempts: 1 });
  expect(job.lastError?.message).toMatch(/UNAVAILABLE|failed after/);
  expect((await db().doc(`${JOBS}/${jobId}/checkpoints/second`).get()).exists).toBe(false);
  // Nothing the step left behind after the failed write lands: s1 is not written either.
  expect(await sectionIds(jobId)).toEqual([]);
  // The next step does the work again and completes.
  const rest = await harness.drain();
  expect(rest.map((outcome) => outcome.kind)).toEqual(['handed-off', 'completed']);
  expect(await sectionIds(jobId)).toEqual(['second~-~s0', 'second~-~s1']);
});

test('progress and notes reported after a section left behind reach the job only once it landed: never when its write fails', async () => {
  const jobId = await atSecondPhase();
  behaviour.second = (context) => {
    context.reportProgress({ sectionsTotal: 2 });
    void context.recordSection('s0', { value: 1 });
    context.reportProgress({ sectionsDone: 1 });
    context.note('section-noted', 's0 recorded');
    return Promise.resolve({ kind: 'done', state: { total: 1 } });
  };
  const outcomes = await whileInterposed(
    aroundCommitsWriting((paths, commit) => (paths.some(isSection) ? Promise.reject(unavailable()) : commit())),
    () => harness.drain(1),
  );
  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['requeued']);
  const job = await harness.readJob(jobId);
  // What was reported before the section is written with the step's last commit; what came after it is not.
  expect(job.progress).toMatchObject({ sectionsTotal: 2 });
  expect(job.progress).not.toHaveProperty('sectionsDone');
  expect(await harness.eventKinds(jobId)).not.toContain('section-noted');

  // With the write landing, both reach the job.
  behaviour.second = (context) => {
    void context.recordSection('s0', { value: 1 });
    context.reportProgress({ sectionsDone: 1 });
    context.note('section-noted', 's0 recorded');
    return Promise.resolve({ kind: 'done', state: { total: 1 } });
  };
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['handed-off']);
  expect((await harness.readJob(jobId)).progress).toMatchObject({ sectionsTotal: 2, sectionsDone: 1 });
  expect(await harness.eventKinds(jobId)).toContain('section-noted');
});

test('a phase that waits for its section record gets it durable, as before', async () => {
  const jobId = await atSecondPhase(1);
  let existedWhenResolved: boolean | null = null;
  behaviour.second = async (context) => {
    await context.recordSection('s0', { value: 5 });
    existedWhenResolved = (await db().doc(`${JOBS}/${jobId}/sections/second~-~s0`).get()).exists;
    return { kind: 'done', state: { total: 5 } };
  };
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['handed-off']);
  expect(existedWhenResolved).toBe(true);
});

describe('bug 50: recording a section again waits for the first record to land', () => {
  test('a section left behind, then awaited again while its commit is slow: the await resolves only once it is on record', async () => {
    const jobId = await atSecondPhase(1);
    const hold = gate();
    let onRecordWhenResolved: boolean | null = null;
    behaviour.second = async (context) => {
      void context.recordSection('s0', { value: 1 });
      // The phase waits for "its" record before acting on it, as recordSection's contract allows.
      await context.recordSection('s0', { value: 1 });
      onRecordWhenResolved = (await db().doc(`${JOBS}/${jobId}/sections/second~-~s0`).get()).exists;
      hold.open();
      return { kind: 'done', state: { total: 1 } };
    };
    const outcomes = await whileInterposed(
      aroundCommitsWriting(async (paths, commit) => {
        // The section's commit lands only after the phase has looked, unless the phase waited for it.
        if (paths.some(isSection)) await Promise.race([hold.promise, new Promise((resolve) => setTimeout(resolve, 2_000))]);
        const results: WriteResult[] = await commit();
        return results;
      }),
      () => harness.drain(1),
    );
    expect(outcomes.map((outcome) => outcome.kind)).toEqual(['handed-off']);
    expect(onRecordWhenResolved).toBe(true);
  });

  test('a section left behind whose write failed, then awaited again: the await rejects, and nothing is checkpointed', async () => {
    const jobId = await atSecondPhase(1);
    let awaited: 'resolved' | 'rejected' | null = null;
    const failed = gate();
    behaviour.second = async (context) => {
      void context.recordSection('s0', { value: 1 }).catch(() => failed.open());
      await failed.promise;
      await context.recordSection('s0', { value: 1 }).then(
        () => (awaited = 'resolved'),
        () => (awaited = 'rejected'),
      );
      return { kind: 'done', state: { total: 1 } };
    };
    const outcomes = await whileInterposed(
      aroundCommitsWriting((paths, commit) => (paths.some(isSection) ? Promise.reject(unavailable()) : commit())),
      () => harness.drain(1),
    );
    expect(awaited).toBe('rejected');
    expect(outcomes.map((outcome) => outcome.kind)).not.toContain('handed-off');
    expect(await sectionIds(jobId)).toEqual([]);
    expect((await db().collection(`${JOBS}/${jobId}/checkpoints`).get()).docs.map((doc) => doc.id)).not.toContain('second');
  });
});
