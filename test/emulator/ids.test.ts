/** Bug 6: IDs Firestore refuses are refused where they enter, with a 4xx or a recorded rejection, never a 500 or a redelivery. */
import { z } from 'zod';
import { firestoreRefusal } from '../../functions/src/core/ids';
import { defineFanOutPhase, definePipeline, pipelineRegistry } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/step';
import { createJobActionHandler } from '../../functions/src/http/job-actions-handler';
import { decodeJob } from '../../functions/src/store/codec';
import { JOBS, REJECTED_TASKS } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';
import { testPipelines } from '../support/test-pipeline';

/** A fan-out whose unit IDs each test chooses. */
let unitIds: string[] = [];
const chosenUnits = definePipeline<Record<string, never>>({
  name: 'chosen-units',
  description: 'Test pipeline: fans out into the units the test lists',
  input: z.strictObject({}),
  phases: [
    defineFanOutPhase<Record<string, never>, { count: number }, { ok: boolean }>({
      name: 'units',
      state: z.object({ count: z.number() }),
      fanOut: {
        units: () => unitIds,
        unitState: z.object({ ok: z.boolean() }),
        runUnit: () => Promise.resolve({ kind: 'done', state: { ok: true } }),
        join: (results) => ({ count: results.size }),
      },
    }),
  ],
  publish: () => ({ outcome: 'complete', title: 'Units', markdown: '', missing: [] }),
});

const harness = engineSuite('ids', pipelineRegistry(...testPipelines.values(), chosenUnits));

const db = () => harness.firestore.db;
const rejections = async () => (await db().collection(REJECTED_TASKS).get()).docs.map((doc) => ({ payload: doc.get('payload') as string, reason: doc.get('reason') as string }));

describe('the rules in core/ids against the official emulator', () => {
  /** Whether the emulator stores a document under `id` (the SDK refuses some IDs before sending them). */
  async function emulatorAccepts(id: string): Promise<boolean> {
    try {
      await db().collection('probe').doc(id).set({ probe: true });
      return true;
    } catch {
      return false;
    }
  }

  // [name, id, accepted by the emulator]. firestoreRefusal follows the documented rules, which are
  // stricter in two places: the emulator (1.19.9) lets exactly "____" through although it matches
  // the documented __.*__, and it stores a lone surrogate as U+FFFD, i.e. under another ID.
  test.each([
    ['a', 'a', true],
    ['__x__', '__x__', false],
    ['__0123456789__', '__0123456789__', false],
    ['_____', '_____', false],
    ['____', '____', true],
    ['__', '__', true],
    ['___', '___', true],
    ['__a', '__a', true],
    ['.', '.', false],
    ['..', '..', false],
    ['...', '...', true],
    ['a/b', 'a/b', false],
    ['a lone surrogate', '\uD800', true],
    ['1500 bytes', 'x'.repeat(1500), true],
    ['1501 bytes', 'x'.repeat(1501), false],
    ['1500 bytes of two-byte characters', 'é'.repeat(750), true],
    ['1502 bytes of two-byte characters', 'é'.repeat(751), false],
  ])('bug 6: %s', async (_name, id, accepted) => {
    expect(await emulatorAccepts(id)).toBe(accepted);
    // Never wider than Firestore: whatever the emulator refuses is refused here too.
    if (!accepted) expect(firestoreRefusal(id)).not.toBeNull();
    if (firestoreRefusal(id) === null) expect(accepted).toBe(true);
  });
});

describe('over HTTP, an ID Firestore refuses is a 400 with a readable message', () => {
  const call = async (action: 'cancel' | 'decide', body: unknown) => {
    const errors: unknown[] = [];
    const handler = createJobActionHandler(action, {
      store: harness.store,
      queue: harness.queue,
      verifyToken: () => Promise.resolve({ uid: 'owner-1' }),
      pipelines: new Map(),
      logger: { warn: () => undefined, error: (message, fields) => errors.push({ message, fields }) },
    });
    const sent: { status: number; body: unknown } = { status: 0, body: undefined };
    const response = {
      status(code: number) {
        sent.status = code;
        return response;
      },
      set() {
        return response;
      },
      json(value: unknown) {
        sent.body = value;
      },
      end() {
        return undefined;
      },
    };
    const headers: Record<string, string> = { authorization: 'Bearer token', 'content-type': 'application/json' };
    await handler({ method: 'POST', get: (name) => headers[name.toLowerCase()], rawBody: Buffer.from(JSON.stringify(body)) }, response);
    return { ...sent, errors };
  };

  test.each([
    ['cancel', { jobId: '__x__' }],
    ['cancel', { jobId: '__0123456789__', reason: 'changed my mind' }],
    ['decide', { jobId: '__x__', questionId: 'scope', answer: 'three' }],
  ] as const)('bug 6: %s %j', async (action, body) => {
    const sent = await call(action, body);
    expect(sent).toEqual({
      status: 400,
      body: { error: 'invalid_request', message: expect.stringMatching(/jobId has the form __name__, which is reserved by Firestore[\s\S]*→ at jobId/) as unknown },
      errors: [],
    });
  });
});

describe('a task naming an ID Firestore refuses is recorded in rejectedTasks and acknowledged', () => {
  test.each([
    ['a reserved job ID', { jobId: '__x__', step: 0 }, /ID has the form __name__, which is reserved by Firestore\n {2}→ at jobId/],
    ['a reserved unit ID', { jobId: 'j1', step: 0, unit: '__u__', phase: 'units' }, /ID has the form __name__[^\n]*\n {2}→ at unit/],
    ['a job ID of ".."', { jobId: '..', step: 0 }, /ID must be 1 to 128 letters[^\n]*\n {2}→ at jobId/],
    ['a job ID over the length limit', { jobId: 'x'.repeat(2000), step: 0 }, /ID must be 1 to 128 [^\n]*\(it is 2000 characters long\)/],
  ])('bug 6: %s', async (_name, payload, reason) => {
    const outcome = await runStep(harness.deps(), payload);
    expect(outcome).toEqual({ kind: 'rejected', reason: expect.stringMatching(reason) as unknown });
    expect(await rejections()).toEqual([{ payload: JSON.stringify(payload), reason: expect.stringMatching(reason) as unknown }]);
    expect(harness.queue.tasks).toEqual([]);
  });

  // Its unit tasks would all be refused by the check above, and the fan-out would never join.
  test('bug 6: a fan-out may list only unit IDs its tasks are accepted with: a reserved one fails the job with the reason', async () => {
    unitIds = ['u1', '__u__'];
    const jobId = await harness.submit('chosen-units', {});
    expect((await harness.drain()).map((outcome) => outcome.kind)).toEqual(['failed']);
    const job = decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
    expect(job.status).toBe('failed');
    expect(job.lastError?.message).toMatch(/could not list its units: Error: unit ID "__u__" has the form __name__/);
    expect((await db().collection(`${JOBS}/${jobId}/units`).get()).size).toBe(0);
  });
});
