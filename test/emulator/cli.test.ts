/**
 * The CLI's commands against the Firestore emulator, under the project's real security rules:
 * user reads go through the REST API with an ID token (as on the local stack), the HTTP functions
 * are the real handlers served in this process, and the engine harness drives jobs one task at a
 * time (a watch's wait between two reads runs the next task, so nothing sleeps).
 */
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { TerminalError } from '../../functions/src/core/errors';
import type { JobRecord } from '../../functions/src/core/job';
import { budgetWait } from '../../functions/src/core/lifecycle';
import { createJobActionHandler } from '../../functions/src/http/job-actions-handler';
import type { HttpRequest, HttpResponse } from '../../functions/src/http/request';
import { createSubmitHandler } from '../../functions/src/http/submit-handler';
import { encodeJob } from '../../functions/src/store/codec';
import { jobPath, sectionKey } from '../../functions/src/store/paths';
import { loadSecurityRules } from '../../scripts/lib/firestore-emulator';
import type { Command } from '../../scripts/cli/args';
import { dateTime, terminalText } from '../../scripts/cli/format';
import { functionsClient } from '../../scripts/cli/functions-client';
import { userFirestore } from '../../scripts/cli/firestore-rest';
import { uidOfToken } from '../../scripts/cli/identity';
import { bufferedIo, type BufferedIo } from '../../scripts/cli/io';
import { guarded, run } from '../../scripts/cli/main';
import { listAll, openOperatorContext, release, sweep, type OperatorContext } from '../../scripts/cli/operator-commands';
import type { LocalTarget } from '../../scripts/cli/target';
import { cancel, decide, listOwn, submit, watch, type UserContext } from '../../scripts/cli/user-commands';
import { engineHarness, type EngineHarness } from '../support/engine';
import { behaviour, firstPhase, resetBehaviour, testPipelines } from '../support/test-pipeline';
import { localCliTarget } from '../support/operators';

// The admin SDK's auth library would otherwise probe the GCE metadata server, off this machine.
process.env.METADATA_SERVER_DETECTION ??= 'none';

const UTC = { timeZone: 'UTC' };
const silent = { warn: () => undefined, error: () => undefined };

let harness: EngineHarness;
let server: Server;
let functionsUrl: string;

/** An unsigned Firebase ID token, as the emulators issue and accept them. */
function idToken(projectId: string, uid: string): string {
  const part = (value: object) => Buffer.from(JSON.stringify(value)).toString('base64url');
  const now = Math.floor(Date.now() / 1000);
  return `${part({ alg: 'none', typ: 'JWT' })}.${part({
    iss: `https://securetoken.google.com/${projectId}`,
    aud: projectId,
    iat: now,
    exp: now + 3600,
    auth_time: now,
    sub: uid,
    user_id: uid,
    firebase: { sign_in_provider: 'custom', identities: {} },
  })}.`;
}

/** Serves the real HTTP handlers (submitJob, cancelJob, decideJob) on a loopback port. */
async function serveFunctions(): Promise<void> {
  const deps = { store: harness.store, queue: harness.queue, verifyToken: (token: string) => Promise.resolve({ uid: uidOfToken(token) }), logger: silent, pipelines: testPipelines };
  const handlers: Record<string, (request: HttpRequest, response: HttpResponse) => Promise<void>> = {
    submitJob: createSubmitHandler(deps),
    cancelJob: createJobActionHandler('cancel', deps),
    decideJob: createJobActionHandler('decide', deps),
  };
  const header = (incoming: IncomingMessage, name: string): string | undefined => {
    const value = incoming.headers[name.toLowerCase()];
    return Array.isArray(value) ? value.join(', ') : value;
  };
  server = createServer((incoming, outgoing) => {
    const chunks: Buffer[] = [];
    incoming.on('data', (chunk: Buffer) => chunks.push(chunk));
    incoming.on('end', () => {
      const handler = handlers[(incoming.url ?? '').split('/').pop() ?? ''];
      if (!handler) {
        outgoing.writeHead(404).end('Function does not exist');
        return;
      }
      const request: HttpRequest = { method: incoming.method ?? 'GET', get: (name) => header(incoming, name), rawBody: Buffer.concat(chunks) };
      const response: HttpResponse = {
        status: (code) => {
          outgoing.statusCode = code;
          return response;
        },
        set: (field, value) => {
          outgoing.setHeader(field, value);
          return response;
        },
        json: (body) => outgoing.setHeader('content-type', 'application/json').end(JSON.stringify(body)),
        end: () => outgoing.end(),
      };
      void handler(request, response);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  functionsUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/${harness.firestore.projectId}/us-central1`;
}

function target(): LocalTarget {
  return localCliTarget(harness.firestore.projectId, functionsUrl);
}

/** A user's context; each wait between two reads of a watched job runs one queued task. */
function asUser(uid: string, io: BufferedIo): UserContext {
  const token = idToken(harness.firestore.projectId, uid);
  const identity = () => Promise.resolve({ uid, idToken: token });
  const where = target();
  return {
    target: where,
    io,
    identity,
    firestore: userFirestore({
      baseUrl: where.firestoreUrl,
      projectId: where.projectId,
      idToken: () => Promise.resolve(token),
      describe: 'the test emulator',
      unreachableHint: '',
    }),
    functions: functionsClient(where, identity),
    pause: async () => {
      if (harness.queue.tasks.length === 0) throw new Error('watch kept waiting, but no task is left to run');
      await harness.drain(1);
    },
    time: UTC,
    readInput: () => Promise.reject(new Error('no input files in these tests')),
  };
}

function asOperator(io: BufferedIo): OperatorContext {
  return { target: target(), io, store: harness.store, queue: harness.queue, now: () => harness.clock.now(), time: UTC, close: () => Promise.resolve() };
}

const watchCommand = (jobId: string, report = false): Extract<Command, { name: 'watch' }> => ({ name: 'watch', jobId, report });

async function readJob(jobId: string): Promise<JobRecord> {
  const job = await harness.store.read(jobId);
  if (!job) throw new Error(`no job ${jobId}`);
  return job;
}

/** Rewrites a job document as the engine would have left it. */
async function rewriteJob(jobId: string, change: (job: JobRecord) => JobRecord): Promise<void> {
  await harness.firestore.db.doc(jobPath(jobId)).set({ ...encodeJob(change(await readJob(jobId))), requestFingerprint: 'test' });
}

/** The timeline as stored, in the order watch must print it. */
async function storedTimeline(jobId: string): Promise<string[]> {
  const events = await harness.firestore.db.collection(`${jobPath(jobId)}/events`).get();
  return events.docs
    .map((event) => ({ id: event.id, atMs: event.get('atMs') as number, kind: event.get('kind') as string }))
    .sort((a, b) => a.atMs - b.atMs || a.id.localeCompare(b.id))
    .map((event) => event.kind);
}

const printedKinds = (io: BufferedIo): string[] =>
  io.stdout.flatMap((line) => {
    const match = /^\d\d:\d\d:\d\d {2}(\S+)/.exec(line);
    return match?.[1] ? [match[1]] : [];
  });

beforeAll(async () => {
  harness = engineHarness('cli', testPipelines);
  await loadSecurityRules(process.env.FIRESTORE_EMULATOR_HOST!, harness.firestore.projectId, join(__dirname, '..', '..', 'firestore.rules'));
  await serveFunctions();
});
beforeEach(async () => {
  resetBehaviour();
  harness.queue.drain();
  await harness.firestore.reset();
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
  await harness.firestore.close();
});

describe('submit and watch', () => {
  test('submit prints the task ID alone on stdout; watch shows every event once, in order, a progress bar, and where the report is', async () => {
    // One section per step, so that the watch sees the job half way.
    behaviour.second = async (context) => {
      const { sections } = context.checkpoint(firstPhase);
      const done = context.sections().length;
      if (done === sections) return { kind: 'done', state: { total: done } };
      await context.recordSection(`s${done}`, { value: done });
      context.reportProgress({ sectionsDone: done + 1, sectionsTotal: sections });
      return { kind: 'yield' };
    };
    const io = bufferedIo();
    const user = asUser('user-1', io);
    expect(await submit(user, { name: 'submit', pipeline: 'two-phase', source: { kind: 'json', input: { sections: 2 } }, watch: false })).toBe(0);
    expect(io.stdout).toHaveLength(1);
    const jobId = io.stdout[0]!;
    expect((await readJob(jobId)).owner).toBe('user-1');
    expect(io.stderr.join('\n')).toContain(`Watch it with: phaseline watch ${jobId}`);

    const watching = bufferedIo();
    expect(await watch(asUser('user-1', watching), watchCommand(jobId, true))).toBe(0);

    const kinds = printedKinds(watching);
    expect(kinds).toEqual(await storedTimeline(jobId));
    expect(kinds[0]).toBe('submitted');
    expect(kinds.at(-1)).toBe('completed');
    expect(watching.stdout.some((line) => line.startsWith('00:00:00  submitted     Submitted to two-phase'))).toBe(true);
    // The bar moved through the sectioned phase and ended full.
    expect(watching.statuses[0]).toMatch(/^queued +\[░{24}\] +-- {2}not started$/);
    expect(watching.statuses).toContainEqual(expect.stringMatching(/^queued +\[█{12}░{12}\] +50% {2}second: 1\/2 sections$/));
    expect(watching.statuses.at(-1)).toBe(`completed   [${'█'.repeat(24)}] 100%  completed`);
    expect(watching.stdout).toContainEqual(expect.stringMatching(/^Completed in \d+ ms\.$/));
    expect(watching.stdout).toContain(`Report: jobs/${jobId}/results/final`);
    expect(watching.stdout.at(-1)).toBe('total 2'); // --report: the published markdown
  });

  test('watch --report prints each report section once, as it is recorded, before the job completes', async () => {
    const jobId = await harness.submit('two-phase', { sections: 1 }, 'user-1');
    const recordedSection = (id: string, seq: number, heading: string, text: string) =>
      harness.firestore.db.doc(`${jobPath(jobId)}/sections/${sectionKey('final-document', null, id)}`).set({
        phase: 'final-document',
        unit: null,
        id,
        seq,
        epoch: 1,
        recordedAtMs: harness.clock.now(),
        data: { headingId: id, heading, text, sources: [], missing: false, note: null },
      });
    const watching = bufferedIo();
    const user = asUser('user-1', watching);
    let pauses = 0;
    // The report's sections appear while the job is still running (written here as the engine would), one per wait.
    const pause = async () => {
      pauses += 1;
      if (pauses === 1) await recordedSection('h1', 0, 'Leases', 'A lease bounds how long a worker holds a job.\u001b[31m');
      if (pauses === 2) await recordedSection('h2', 1, 'Fencing', 'Each claim carries an epoch.');
      await user.pause();
    };
    expect(await watch({ ...user, pause }, watchCommand(jobId, true))).toBe(0);

    const out = watching.stdout;
    const at = (text: string) => out.findIndex((line) => line.includes(text));
    const completedAt = out.findIndex((line) => /\bcompleted\b/.test(line));
    expect(at('Leases')).toBeGreaterThan(-1);
    expect(at('Fencing')).toBeGreaterThan(at('Leases'));
    expect(at('Fencing')).toBeLessThan(completedAt);
    // Each printed once while the job ran, model text made terminal-safe (no raw escape character).
    expect(out.filter((line) => line.includes('A lease bounds how long')).length).toBe(1);
    expect(out.join('\n')).not.toContain('\u001b');
  });

  test('watch stops at a decision with the command to answer it; a refused answer prints the server\'s message; a valid one lets the job finish', async () => {
    behaviour.first = (context) =>
      Promise.resolve(
        context.decisions.scope === undefined
          ? { kind: 'wait', reason: 'decision', questionId: 'scope', question: 'How many sections?', options: ['one', 'three'] }
          : { kind: 'done', state: { sections: context.decisions.scope === 'one' ? 1 : 3 } },
      );
    const jobId = await harness.submit('two-phase', { sections: 2 }, 'user-1');
    const first = bufferedIo();
    expect(await watch(asUser('user-1', first), watchCommand(jobId))).toBe(0);
    expect(first.statuses.at(-1)).toContain('needs your decision: How many sections?');
    expect(first.stdout.slice(-3)).toEqual([
      'Waiting for your decision: How many sections?',
      'Options: "one", "three"',
      `Answer with: phaseline decide ${jobId} scope <option>`,
    ]);

    const refused = bufferedIo();
    expect(await guarded(refused, () => decide(asUser('user-1', refused), { name: 'decide', jobId, questionId: 'scope', answer: 'seven' }))).toBe(1);
    expect(refused.stderr).toEqual(['phaseline: decideJob was refused (400 invalid_request): "seven" is not one of the options: "one", "three"']);

    const answered = bufferedIo();
    expect(await decide(asUser('user-1', answered), { name: 'decide', jobId, questionId: 'scope', answer: 'three' })).toBe(0);
    expect(answered.stdout[0]).toContain('Answered scope: "three".');
    const second = bufferedIo();
    expect(await watch(asUser('user-1', second), watchCommand(jobId))).toBe(0);
    expect(printedKinds(second)).toContain('decided');
    expect(second.statuses.at(-1)).toMatch(/^completed/);
    expect((await readJob(jobId)).decisions).toEqual({ scope: 'three' });
  });

  test('watch exits 1 with the reason when the job fails', async () => {
    behaviour.first = () => Promise.reject(new TerminalError('the input cannot be processed'));
    const jobId = await harness.submit('two-phase', { sections: 1 }, 'user-1');
    const io = bufferedIo();
    expect(await watch(asUser('user-1', io), watchCommand(jobId))).toBe(1);
    expect(io.statuses.at(-1)).toMatch(/^failed +\[.*\] +-- {2}failed: .*the input cannot be processed/);
    expect(io.stdout.at(-1)).toMatch(/^Failed in .*: .*the input cannot be processed/);
  });

  test('watch refuses another user\'s job and a job that does not exist alike, under the rules', async () => {
    const jobId = await harness.submit('two-phase', { sections: 1 }, 'user-1');
    for (const [uid, id] of [
      ['user-2', jobId],
      ['user-1', 'no-such-job'],
    ] as const) {
      const io = bufferedIo();
      expect(await guarded(io, () => watch(asUser(uid, io), watchCommand(id)))).toBe(1);
      expect(io.stderr[0]).toBe(`phaseline: No job ${id} that you can read: it does not exist on the local stack (project ${harness.firestore.projectId}; Firestore ${process.env.FIRESTORE_EMULATOR_HOST!}, functions ${functionsUrl}, Auth 127.0.0.1:1), or it belongs to another user (you are ${uid}).`);
    }
  });
});

describe('cancel', () => {
  test('only the owner cancels; a second cancel is refused with the server\'s message', async () => {
    const jobId = await harness.submit('two-phase', { sections: 1 }, 'user-1');

    const stranger = bufferedIo();
    expect(await guarded(stranger, () => cancel(asUser('user-2', stranger), { name: 'cancel', jobId }))).toBe(1);
    expect(stranger.stderr[0]).toBe(`phaseline: cancelJob was refused (404 not_found): No job ${jobId}`);

    const owner = bufferedIo();
    expect(await cancel(asUser('user-1', owner), { name: 'cancel', jobId, reason: 'changed my mind' })).toBe(0);
    expect(owner.stdout[0]).toBe(`Job ${jobId} is cancelled.`);
    expect(owner.stdout[1]).toContain('(changed my mind)');
    expect((await readJob(jobId)).status).toBe('cancelled');

    const again = bufferedIo();
    expect(await guarded(again, () => cancel(asUser('user-1', again), { name: 'cancel', jobId }))).toBe(1);
    expect(again.stderr[0]).toBe(`phaseline: cancelJob was refused (409 conflict): Job ${jobId} is already cancelled`);

    const watching = bufferedIo();
    expect(await watch(asUser('user-1', watching), watchCommand(jobId))).toBe(1);
    expect(watching.stdout).toContainEqual(expect.stringMatching(/^Cancelled in \d+ ms\.$/));
  });
});

describe('list', () => {
  async function threeJobs(): Promise<string[]> {
    const ids: string[] = [];
    for (const owner of ['user-1', 'user-2', 'user-1']) {
      ids.push(await harness.submit('two-phase', { sections: 1 }, owner));
      harness.clock.advance(60_000);
    }
    return ids;
  }

  test('a user lists their own jobs, newest first, through the rules', async () => {
    const [older, theirs, newer] = await threeJobs();
    const io = bufferedIo();
    expect(await listOwn(asUser('user-1', io), { name: 'list', all: false, limit: 20 })).toBe(0);
    expect(io.stdout[0]).toMatch(/^JOB +STATUS +PIPELINE +PROGRESS +CREATED +DETAIL$/);
    expect(io.stdout.slice(1).map((line) => line.split(' ')[0])).toEqual([newer, older]);
    expect(io.stdout.join('\n')).not.toContain(theirs);
    expect(io.stdout[1]).toMatch(/ queued +two-phase +-- +2026-01-01 00:02 +not started$/);
  });

  test('--all lists every user\'s jobs through the admin SDK on the emulator, with their owners', async () => {
    const [older, theirs, newer] = await threeJobs();
    const io = bufferedIo();
    // The operator context points this process's emulator variables at the target: put them back after.
    const saved = { ...process.env };
    const ctx = await openOperatorContext(target(), io, {});
    try {
      expect(process.env.CLOUD_TASKS_EMULATOR_HOST).toBe('127.0.0.1:1');
      expect(await listAll({ ...ctx, time: UTC }, { name: 'list', all: true, limit: 2 })).toBe(0);
    } finally {
      await ctx.close();
      process.env.FIRESTORE_EMULATOR_HOST = saved.FIRESTORE_EMULATOR_HOST;
      if (saved.CLOUD_TASKS_EMULATOR_HOST === undefined) delete process.env.CLOUD_TASKS_EMULATOR_HOST;
      else process.env.CLOUD_TASKS_EMULATOR_HOST = saved.CLOUD_TASKS_EMULATOR_HOST;
    }
    expect(io.stdout[0]).toMatch(/^JOB +STATUS +PIPELINE +PROGRESS +CREATED +OWNER +DETAIL$/);
    expect(io.stdout.slice(1).map((line) => line.split(' ')[0])).toEqual([newer, theirs]);
    expect(io.stdout[2]).toContain('user-2');
    expect(io.stdout.join('\n')).not.toContain(older);
  });
});

describe('bug 34: jobs waiting at their spend cap, unreadable jobs, hostile owner IDs', () => {
  /** `list --all` as an operator, the emulator variables put back after. */
  async function listEveryJob(io: BufferedIo): Promise<number> {
    const saved = { ...process.env };
    const ctx = await openOperatorContext(target(), io, {});
    try {
      return await listAll({ ...ctx, time: UTC }, { name: 'list', all: true, limit: 20 });
    } finally {
      await ctx.close();
      process.env.FIRESTORE_EMULATOR_HOST = saved.FIRESTORE_EMULATOR_HOST;
      if (saved.CLOUD_TASKS_EMULATOR_HOST === undefined) delete process.env.CLOUD_TASKS_EMULATOR_HOST;
      else process.env.CLOUD_TASKS_EMULATOR_HOST = saved.CLOUD_TASKS_EMULATOR_HOST;
    }
  }

  test('bug 34: watch stops at a spend-cap wait and says how to resume or cancel it; list shows that job and skips, with a note, one it cannot read', async () => {
    const paused = await harness.submit('two-phase', { sections: 1 }, 'user-1');
    harness.clock.advance(60_000);
    const unreadable = await harness.submit('two-phase', { sections: 1 }, 'user-1');
    harness.queue.drain();
    const resetAtMs = harness.clock.now() + 3_600_000;
    await rewriteJob(paused, (job) => ({ ...job, status: 'waiting', waiting: budgetWait({ message: "Today's model spend of $1.00 reached this account's daily limit of $1.00.", resetAtMs }) }));
    await harness.firestore.db.doc(jobPath(unreadable)).update({ status: 'exploded' });

    const watched = bufferedIo();
    expect(await watch(asUser('user-1', watched), watchCommand(paused))).toBe(0);
    expect(watched.stderr).toEqual([]);
    const resumes = dateTime(resetAtMs, UTC);
    expect(watched.statuses.at(-1)).toMatch(new RegExp(`^waiting .* paused at the daily spend limit until ${resumes}$`));
    expect(watched.stdout.slice(-2)).toEqual([
      `It resumes by itself at ${resumes}. Once an operator has raised the limit, resume it sooner with: phaseline decide ${paused} budget resume`,
      `Or stop it: phaseline cancel ${paused}`,
    ]);

    const listed = bufferedIo();
    expect(await listOwn(asUser('user-1', listed), { name: 'list', all: false, limit: 20 })).toBe(0);
    expect(listed.stdout.slice(1).map((line) => line.split(' ')[0])).toEqual([paused]);
    expect(listed.stdout[1]).toMatch(/ waiting +two-phase +-- .* paused at the daily spend limit/);
    expect(listed.stderr).toEqual([expect.stringMatching(/^Jobs of user-1/), expect.stringMatching(new RegExp(`^Skipped job ${unreadable}: .*cannot read`))]);
  });

  test('bug 34: list --all shows owner IDs with their control characters escaped', async () => {
    const hostile = 'user\u001b]0;owned\u0007\u001b[2J\u009b31m\u202e';
    await harness.submit('two-phase', { sections: 1 }, hostile);
    const io = bufferedIo();
    expect(await listEveryJob(io)).toBe(0);
    expect(io.stdout[1]).toContain('user\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\u202e');
    // A line without control characters is the one terminalText leaves as it is.
    for (const line of [...io.stdout, ...io.stderr]) expect(terminalText(line)).toBe(line);
  });
});

describe('operator actions', () => {
  test('release requeues a quarantined job with a fresh budget and enqueues its task; any other status is refused', async () => {
    const jobId = await harness.submit('two-phase', { sections: 1 }, 'user-1');
    harness.queue.drain();
    await rewriteJob(jobId, (job) => ({
      ...job,
      status: 'quarantined',
      epoch: 4,
      step: 4,
      staleReclaims: 4,
      attempts: 2,
      quarantine: { reason: 'its lease expired 4 times', atMs: harness.clock.now() },
      finishedAtMs: harness.clock.now(),
    }));

    const io = bufferedIo();
    expect(await release(asOperator(io), { name: 'release', jobId })).toBe(0);
    expect(io.stdout).toEqual([`Released job ${jobId}: queued at step 5, attempts and stale reclaims reset to 0.`, `Task ${jobId}-s5-d0 enqueued.`]);
    expect(await readJob(jobId)).toMatchObject({ status: 'queued', attempts: 0, staleReclaims: 0, quarantine: null, step: 5 });
    expect(harness.queue.tasks.map((task) => task.id)).toEqual([`${jobId}-s5-d0`]);
    expect(await storedTimeline(jobId)).toEqual(['submitted', 'released']);

    const again = bufferedIo();
    expect(await guarded(again, () => release(asOperator(again), { name: 'release', jobId }))).toBe(1);
    expect(again.stderr).toEqual([`phaseline: Release refused: Job ${jobId} is queued; only a quarantined job can be released.`]);

    const missing = bufferedIo();
    expect(await guarded(missing, () => release(asOperator(missing), { name: 'release', jobId: 'no-such-job' }))).toBe(1);
    expect(missing.stderr[0]).toMatch(/^phaseline: Release refused: Job no-such-job cannot be released: .*does not exist/);
  });

  test('sweep runs one pass of the engine\'s sweeper and reports it: an expired lease is reclaimed and its task enqueued', async () => {
    const jobId = await harness.submit('two-phase', { sections: 1 }, 'user-1');
    harness.queue.drain();
    const now = harness.clock.now();
    await rewriteJob(jobId, (job) => ({ ...job, status: 'running', epoch: 1, lease: { epoch: 1, worker: 'a-dead-worker', expiresAtMs: now - 1_000 } }));

    const io = bufferedIo();
    expect(await sweep(asOperator(io))).toBe(0);
    expect(io.stdout[0]).toBe(`Sweep at ${new Date(now).toISOString()}:`);
    expect(io.stdout).toContain('  reclaimed      1 expired job lease, 0 expired unit leases');
    expect(io.stdout).toContain('  tasks          1 enqueued, 0 failed (a failed one is dispatched again by a later sweep)');
    expect(await readJob(jobId)).toMatchObject({ status: 'queued', staleReclaims: 1, lease: null });
    expect(harness.queue.tasks).toHaveLength(1);

    const idle = bufferedIo();
    expect(await sweep(asOperator(idle))).toBe(0);
    expect(idle.stdout).toContain('  reclaimed      0 expired job leases, 0 expired unit leases');
  });

  test('queue stats says plainly that it is not available under the emulator, and exits 1', async () => {
    const io = bufferedIo();
    expect(await run(['queue', 'stats'], io, { FIRESTORE_EMULATOR_HOST: process.env.FIRESTORE_EMULATOR_HOST! })).toBe(1);
    expect(io.stdout).toEqual([]);
    expect(io.stderr).toEqual([
      'phaseline: `phaseline queue stats` is not available under the emulator: the Cloud Tasks emulator only takes the tasks the functions enqueue ' +
        'and does not serve the Cloud Tasks API (getQueue, pauseQueue, resumeQueue) this command uses. Run it against a deployed project: ' +
        'phaseline --project <project-id> queue stats',
    ]);
  });
});
