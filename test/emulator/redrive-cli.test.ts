/**
 * `phaseline redrive <jobId> --from <phase> --reason "<text>"` against the Firestore emulator, in the
 * style of cli.test.ts: the operator command over the engine's redriveJob (what it prints, what it
 * refuses, exit statuses), and once the whole way from the command line through the admin SDK with
 * the deployed pipelines' phase lists.
 */
import { canaryPipeline } from '../../functions/src/pipelines/canary';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import type { JobRecord } from '../../functions/src/core/job';
import { jobPath, JOBS } from '../../functions/src/store/paths';
import { SET_ASIDE } from '../../functions/src/store/phase-documents';
import type { Command } from '../../scripts/cli/args';
import { bufferedIo, type BufferedIo } from '../../scripts/cli/io';
import { guarded, run } from '../../scripts/cli/main';
import { redrive, type OperatorContext } from '../../scripts/cli/operator-commands';
import type { LocalTarget } from '../../scripts/cli/target';
import { engineSuite } from '../support/engine';
import { testPipeline } from '../support/test-pipeline';
import { localCliTarget } from '../support/operators';

// The admin SDK's auth library would otherwise probe the GCE metadata server, off this machine.
process.env.METADATA_SERVER_DETECTION ??= 'none';

const pipelines = pipelineRegistry(testPipeline, canaryPipeline);

const harness = engineSuite('redrive-cli', pipelines);

function target(): LocalTarget {
  return localCliTarget(harness.firestore.projectId);
}

function asOperator(io: BufferedIo): OperatorContext {
  return { target: target(), io, store: harness.store, queue: harness.queue, now: () => harness.clock.now(), time: { timeZone: 'UTC' }, pipelines, close: () => Promise.resolve() };
}

const command = (jobId: string, fromPhase: string, extra: Partial<Extract<Command, { name: 'redrive' }>> = {}): Extract<Command, { name: 'redrive' }> => ({
  name: 'redrive',
  jobId,
  fromPhase,
  reason: 'the totals were computed wrong',
  by: 'ops-ana',
  ...extra,
});

async function readJob(jobId: string): Promise<JobRecord> {
  const job = await harness.store.read(jobId);
  if (!job) throw new Error(`no job ${jobId}`);
  return job;
}

test('redrive re-runs a completed job from a phase: what it set aside, where, the task; the timeline says who and why', async () => {
  const jobId = await harness.submit('two-phase', { sections: 2 }, 'user-1');
  await harness.drain();
  const before = await readJob(jobId);

  const io = bufferedIo();
  expect(await redrive(asOperator(io), command(jobId, 'second'))).toBe(0);
  const step = before.step + 1;
  expect(io.stdout).toEqual([
    `Re-drove job ${jobId} from second: queued at step ${step}, attempts and stale reclaims reset to 0.`,
    `Set aside for audit: 4 documents, under jobs/${jobId}/setAside/r1e${before.epoch}~…`,
    `Task ${jobId}-s${step}-d0 enqueued.`,
  ]);
  expect(io.stderr).toEqual([]);
  expect(await readJob(jobId)).toMatchObject({ status: 'queued', phase: 'second', redrive: { count: 1, by: 'ops-ana', reason: 'the totals were computed wrong', previousStatus: 'completed' } });
  const events = await harness.firestore.db.collection(`${jobPath(jobId)}/events`).where('kind', '==', 'redriven').get();
  expect(events.docs.map((doc) => doc.get('message') as string)).toEqual([expect.stringMatching(/^Re-driven from second by ops-ana: the totals were computed wrong\. It was completed;/)]);
  await harness.drain();
  expect((await readJob(jobId)).status).toBe('completed');
});

test('without --by, the timeline names the login running the CLI', async () => {
  const jobId = await harness.submit('two-phase', { sections: 1 }, 'user-1');
  await harness.drain();
  const { by: _by, ...withoutBy } = command(jobId, 'first');
  expect(await redrive(asOperator(bufferedIo()), withoutBy)).toBe(0);
  expect((await readJob(jobId)).redrive?.by).toMatch(/ \(phaseline CLI\)$/);
});

test('refusals exit 1 with the reason on stderr, and change nothing', async () => {
  const jobId = await harness.submit('two-phase', { sections: 1 }, 'user-1');
  harness.queue.drain();
  const queued = bufferedIo();
  expect(await guarded(queued, () => redrive(asOperator(queued), command(jobId, 'second')))).toBe(1);
  expect(queued.stderr).toEqual([`phaseline: Re-drive refused: Job ${jobId} is queued; only a completed, failed or quarantined job can be re-driven (a queued job is still in the engine's hands).`]);

  await harness.queue.enqueue({ jobId, step: 0 }, { id: 'rerun' });
  await harness.drain();
  const unknown = bufferedIo();
  expect(await guarded(unknown, () => redrive(asOperator(unknown), command(jobId, 'third')))).toBe(1);
  expect(unknown.stderr).toEqual(['phaseline: Re-drive refused: Pipeline two-phase has no phase "third"; its phases are first, second.']);

  const missing = bufferedIo();
  expect(await guarded(missing, () => redrive(asOperator(missing), command('no-such-job', 'first')))).toBe(1);
  expect(missing.stderr).toEqual(['phaseline: Re-drive refused: Job no-such-job does not exist.']);
  expect((await readJob(jobId)).status).toBe('completed');
  expect((await harness.firestore.db.collection(`${JOBS}/${jobId}/${SET_ASIDE}`).get()).size).toBe(0);
});

test('the whole way from the command line: the admin SDK on the emulator, the deployed pipelines\' phases, a task that cannot be enqueued', async () => {
  const jobId = await harness.submit('canary', { text: 'One two.\n\nThree.' }, 'user-1');
  await harness.drain();
  expect((await readJob(jobId)).status).toBe('completed');

  const io = bufferedIo();
  // The operator context points this process's emulator variables at the target: put them back after.
  const saved = { ...process.env };
  let code: number;
  try {
    code = await run(
      ['--project', harness.firestore.projectId, 'redrive', jobId, '--from', 'summarize', '--reason', 'summaries were cut short', '--by', 'ops-bo'],
      io,
      { FIRESTORE_EMULATOR_HOST: process.env.FIRESTORE_EMULATOR_HOST, CLOUD_TASKS_EMULATOR_HOST: '127.0.0.1:1' },
    );
  } finally {
    process.env.FIRESTORE_EMULATOR_HOST = saved.FIRESTORE_EMULATOR_HOST;
    if (saved.CLOUD_TASKS_EMULATOR_HOST === undefined) delete process.env.CLOUD_TASKS_EMULATOR_HOST;
    else process.env.CLOUD_TASKS_EMULATOR_HOST = saved.CLOUD_TASKS_EMULATOR_HOST;
  }
  expect(io.stderr.filter((line) => !line.startsWith('warning: re-drive: the job is queued but its task could not be enqueued'))).toEqual([]);
  expect(code).toBe(0);
  const job = await readJob(jobId);
  expect(io.stdout[0]).toBe(`Re-drove job ${jobId} from summarize: queued at step ${job.step}, attempts and stale reclaims reset to 0.`);
  // The summarize checkpoint, its two sections and the published answer.
  expect(io.stdout[1]).toMatch(/^Set aside for audit: 4 documents, under /);
  expect(io.stdout[2]).toBe(`Its task ${jobId}-s${job.step}-d0 could not be enqueued; the job stays queued and the sweeper dispatches it once the lost-task grace period has passed.`);
  expect(job).toMatchObject({ status: 'queued', phase: 'summarize', redrive: { by: 'ops-bo', reason: 'summaries were cut short' } });

  const refused = bufferedIo();
  const saved2 = { ...process.env };
  try {
    expect(await run(['--project', harness.firestore.projectId, 'redrive', jobId, '--from', 'summarize', '--reason', 'again'], refused, { FIRESTORE_EMULATOR_HOST: process.env.FIRESTORE_EMULATOR_HOST, CLOUD_TASKS_EMULATOR_HOST: '127.0.0.1:1' })).toBe(1);
  } finally {
    process.env.FIRESTORE_EMULATOR_HOST = saved2.FIRESTORE_EMULATOR_HOST;
    if (saved2.CLOUD_TASKS_EMULATOR_HOST === undefined) delete process.env.CLOUD_TASKS_EMULATOR_HOST;
    else process.env.CLOUD_TASKS_EMULATOR_HOST = saved2.CLOUD_TASKS_EMULATOR_HOST;
  }
  expect(refused.stderr).toEqual([`phaseline: Re-drive refused: Job ${jobId} is queued; only a completed, failed or quarantined job can be re-driven (a queued job is still in the engine's hands).`]);

  const usage = bufferedIo();
  expect(await run(['redrive', jobId, '--from', 'summarize'], usage, {})).toBe(2);
  expect(usage.stderr[0]).toBe('phaseline: redrive needs --reason "<why>": the job\'s timeline records who re-drove it and why');
});
