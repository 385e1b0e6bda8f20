import { CliError, RefusedError } from '../../scripts/cli/errors';
import { decodeValue, userFirestore } from '../../scripts/cli/firestore-rest';
import { functionsClient } from '../../scripts/cli/functions-client';
import { bufferedIo } from '../../scripts/cli/io';
import { queueCommand, type QueueAdmin } from '../../scripts/cli/queue-commands';
import { resolveTarget, type DeployedTarget } from '../../scripts/cli/target';
import { jobViewFromData } from '../../scripts/cli/views';

interface Call {
  readonly url: string;
  readonly method: string;
  readonly headers: Record<string, string>;
  readonly body: unknown;
}

function fakeFetch(answer: (call: Call) => Response | Promise<Response>): { fetchFn: typeof fetch; calls: Call[] } {
  const calls: Call[] = [];
  const fetchFn = (async (url: string | URL | Request, init?: RequestInit) => {
    const call = {
      url: typeof url === 'string' ? url : url instanceof URL ? url.href : url.url,
      method: init?.method ?? 'GET',
      headers: (init?.headers ?? {}) as Record<string, string>,
      body: typeof init?.body === 'string' ? (JSON.parse(init.body) as unknown) : undefined,
    };
    calls.push(call);
    return answer(call);
  }) as typeof fetch;
  return { fetchFn, calls };
}

const refused = (() => Promise.reject(new TypeError('fetch failed', { cause: { code: 'ECONNREFUSED' } }))) as typeof fetch;
const identity = () => Promise.resolve({ uid: 'u1', idToken: 'tok' });

describe('Firestore REST values', () => {
  test('decode to plain JavaScript: integers as numbers, timestamps as Dates, maps and arrays nested', () => {
    expect(
      decodeValue({
        mapValue: {
          fields: {
            n: { integerValue: '42' },
            d: { doubleValue: 0.5 },
            s: { stringValue: 'x' },
            b: { booleanValue: false },
            z: { nullValue: null },
            t: { timestampValue: '2026-01-01T00:00:01.500Z' },
            a: { arrayValue: { values: [{ stringValue: 'one' }, { integerValue: '2' }] } },
            e: { arrayValue: {} },
            m: { mapValue: {} },
          },
        },
      }),
    ).toEqual({ n: 42, d: 0.5, s: 'x', b: false, z: null, t: new Date('2026-01-01T00:00:01.500Z'), a: ['one', 2], e: [], m: {} });
  });

  test('a decoded job document becomes the job view', () => {
    const at = new Date('2026-01-01T00:00:00Z');
    const view = jobViewFromData('j1', {
      owner: 'u1',
      pipeline: 'research',
      status: 'waiting',
      outcome: null,
      phase: 'outline',
      progress: { sectionsTotal: 3 },
      cost: {},
      waiting: { reason: 'decision', questionId: 'q', question: 'Which?', options: ['a'], until: null },
      lastError: null,
      quarantine: null,
      cancellation: null,
      fanout: null,
      conversationId: null,
      createdAt: at,
      updatedAt: at,
      finishedAt: null,
      lease: null, // fields the CLI does not show are fine
    });
    expect(view).toMatchObject({ id: 'j1', status: 'waiting', createdAtMs: at.getTime(), waiting: { questionId: 'q', untilMs: null } });
    expect(() => jobViewFromData('j2', { owner: 'u1', status: 'exploded' })).toThrow(/Job j2 has a document this CLI cannot read/);
  });

  test('bug 34: a job waiting at its spend cap (wait reason budget) decodes, with its resume time', () => {
    const at = new Date('2026-01-01T00:00:00Z');
    const until = new Date('2026-01-02T00:00:00Z');
    const view = jobViewFromData('j1', {
      owner: 'u1',
      pipeline: 'research',
      status: 'waiting',
      waiting: { reason: 'budget', questionId: 'budget', question: 'Spend limit reached.', options: ['resume', 'cancel'], until },
      createdAt: at,
      updatedAt: at,
    });
    expect(view.waiting).toEqual({ reason: 'budget', questionId: 'budget', question: 'Spend limit reached.', options: ['resume', 'cancel'], untilMs: until.getTime() });
  });
});

describe('the user\'s Firestore reads', () => {
  const options = { baseUrl: 'http://127.0.0.1:8080/v1', projectId: 'demo-p', idToken: () => Promise.resolve('tok'), describe: 'the Firestore emulator at 127.0.0.1:8080', unreachableHint: 'Start it.' };

  test('a document read carries the ID token; missing and forbidden both read as null', async () => {
    const { fetchFn, calls } = fakeFetch((call) =>
      call.url.endsWith('/jobs/mine')
        ? Response.json({ name: 'projects/demo-p/databases/(default)/documents/jobs/mine', fields: { owner: { stringValue: 'u1' } } })
        : new Response('{"error":{"code":403}}', { status: call.url.endsWith('/jobs/theirs') ? 403 : 404 }),
    );
    const firestore = userFirestore({ ...options, fetch: fetchFn });
    expect(await firestore.get('jobs/mine')).toEqual({ id: 'mine', path: 'jobs/mine', data: { owner: 'u1' } });
    expect(await firestore.get('jobs/theirs')).toBeNull();
    expect(await firestore.get('jobs/none')).toBeNull();
    expect(calls[0]).toMatchObject({ url: 'http://127.0.0.1:8080/v1/projects/demo-p/databases/(default)/documents/jobs/mine', method: 'GET', headers: { authorization: 'Bearer tok' } });
  });

  test('a query is a structured query under its parent; results without a document are skipped', async () => {
    const { fetchFn, calls } = fakeFetch(() =>
      Response.json([{ document: { name: 'projects/demo-p/databases/(default)/documents/jobs/j1/events/j00000001', fields: { atMs: { integerValue: '5' } } } }, { readTime: 'x' }]),
    );
    const firestore = userFirestore({ ...options, fetch: fetchFn });
    const found = await firestore.query('jobs/j1', {
      collection: 'events',
      where: [{ field: 'atMs', op: 'GREATER_THAN_OR_EQUAL', value: 0 }],
      orderBy: [{ field: 'atMs', direction: 'ASCENDING' }],
    });
    expect(found).toEqual([{ id: 'j00000001', path: 'jobs/j1/events/j00000001', data: { atMs: 5 } }]);
    expect(calls[0]).toMatchObject({
      url: 'http://127.0.0.1:8080/v1/projects/demo-p/databases/(default)/documents/jobs/j1:runQuery',
      method: 'POST',
      body: {
        structuredQuery: {
          from: [{ collectionId: 'events' }],
          where: { fieldFilter: { field: { fieldPath: 'atMs' }, op: 'GREATER_THAN_OR_EQUAL', value: { integerValue: '0' } } },
          orderBy: [{ field: { fieldPath: 'atMs' }, direction: 'ASCENDING' }],
        },
      },
    });
  });

  test('two filters are joined with AND, with a limit; a query at the root has no parent path', async () => {
    const { fetchFn, calls } = fakeFetch(() => Response.json([]));
    await userFirestore({ ...options, fetch: fetchFn }).query('', {
      collection: 'jobs',
      where: [
        { field: 'owner', op: 'EQUAL', value: 'u1' },
        { field: 'score', op: 'GREATER_THAN_OR_EQUAL', value: 0.5 },
      ],
      limit: 3,
    });
    expect(calls[0]?.url).toBe('http://127.0.0.1:8080/v1/projects/demo-p/databases/(default)/documents:runQuery');
    expect(calls[0]?.body).toEqual({
      structuredQuery: {
        from: [{ collectionId: 'jobs' }],
        where: {
          compositeFilter: {
            op: 'AND',
            filters: [
              { fieldFilter: { field: { fieldPath: 'owner' }, op: 'EQUAL', value: { stringValue: 'u1' } } },
              { fieldFilter: { field: { fieldPath: 'score' }, op: 'GREATER_THAN_OR_EQUAL', value: { doubleValue: 0.5 } } },
            ],
          },
        },
        limit: 3,
      },
    });
  });

  test('a refused query reports the server\'s message (a missing index names its link)', async () => {
    const { fetchFn } = fakeFetch(() => Response.json([{ error: { code: 400, message: 'The query requires an index. You can create it here: https://console…' } }], { status: 400 }));
    await expect(userFirestore({ ...options, fetch: fetchFn }).query('', { collection: 'jobs' })).rejects.toThrow(
      new CliError('Reading jobs failed (400): The query requires an index. You can create it here: https://console…'),
    );
  });

  test('an emulator that does not answer is named, with the hint', async () => {
    await expect(userFirestore({ ...options, fetch: refused }).get('jobs/j1')).rejects.toThrow(
      new CliError('Could not reach the Firestore emulator at 127.0.0.1:8080 (connection refused). Start it.'),
    );
  });
});

describe('the HTTP functions', () => {
  const local = resolveTarget({}, {});

  test('a call posts JSON with the ID token and the extra headers', async () => {
    const { fetchFn, calls } = fakeFetch(() => Response.json({ taskId: 't1' }, { status: 202 }));
    const answer = await functionsClient(local, identity, fetchFn).call('submitJob', { pipeline: 'p' }, { 'idempotency-key': 'k' });
    expect(answer).toMatchObject({ status: 202, body: { taskId: 't1' } });
    expect(calls[0]).toEqual({
      url: 'http://127.0.0.1:5001/demo-phaseline/us-central1/submitJob',
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer tok', 'idempotency-key': 'k' },
      body: { pipeline: 'p' },
    });
  });

  test('a refusal carries the server\'s code and message', async () => {
    const { fetchFn } = fakeFetch(() => Response.json({ error: 'conflict', message: 'Job j1 is already completed' }, { status: 409 }));
    const call = functionsClient(local, identity, fetchFn).call('cancelJob', { jobId: 'j1' });
    await expect(call).rejects.toBeInstanceOf(RefusedError);
    await expect(functionsClient(local, identity, fetchFn).call('cancelJob', { jobId: 'j1' })).rejects.toThrow('cancelJob was refused (409 conflict): Job j1 is already completed');
  });

  test('a function that is not there, and a stack that is not running, say what to do', async () => {
    const { fetchFn } = fakeFetch(() => new Response('Function us-central1-submitJob does not exist', { status: 404 }));
    await expect(functionsClient(local, identity, fetchFn).call('submitJob', {})).rejects.toThrow(
      'submitJob is not at http://127.0.0.1:5001/demo-phaseline/us-central1/submitJob (404: Function us-central1-submitJob does not exist). Is the local stack running? Start it with `npm start`.',
    );
    await expect(functionsClient(local, identity, refused).call('submitJob', {})).rejects.toThrow(
      'Could not reach submitJob at http://127.0.0.1:5001/demo-phaseline/us-central1/submitJob (connection refused). Is the local stack running? Start it with `npm start`.',
    );
    const deployed = resolveTarget({ project: 'acme-prod' }, {});
    await expect(functionsClient(deployed, identity, refused).call('submitJob', {})).rejects.toThrow(/Check that the functions are deployed to acme-prod in us-central1/);
  });
});

describe('queue commands on a deployed project', () => {
  const deployed = resolveTarget({ project: 'acme-prod' }, {}) as DeployedTarget;
  const name = 'projects/acme-prod/locations/us-central1/queues/runJobStep';

  function fakeAdmin(failWith?: Error): { admin: QueueAdmin; log: string[] } {
    const log: string[] = [];
    const act = (what: string, result: string) => (queue: string) => {
      log.push(`${what} ${queue}`);
      return failWith ? Promise.reject(failWith) : Promise.resolve(result);
    };
    return {
      log,
      admin: {
        stats: (queue) => {
          log.push(`stats ${queue}`);
          return Promise.resolve({
            name: queue,
            state: 'RUNNING',
            tasks: 0,
            oldestTaskMs: null,
            dispatchedLastMinute: 0,
            running: 0,
            effectiveRatePerSecond: 0,
            maxRatePerSecond: 50,
            maxConcurrent: 100,
          });
        },
        pause: act('pause', 'PAUSED'),
        resume: act('resume', 'RUNNING'),
        close: () => {
          log.push('close');
          return Promise.resolve();
        },
      },
    };
  }

  test('stats, pause and resume act on the step function\'s queue and close the client', async () => {
    for (const [action, expected] of [
      ['stats', `Queue ${name}: RUNNING`],
      ['pause', `Queue ${name} is now PAUSED: no step or unit task is dispatched until \`phaseline queue resume\`. Tasks keep being accepted.`],
      ['resume', `Queue ${name} is now RUNNING: dispatching again.`],
    ] as const) {
      const io = bufferedIo();
      const { admin, log } = fakeAdmin();
      expect(await queueCommand(deployed, io, { name: 'queue', action }, () => Promise.resolve(admin))).toBe(0);
      expect(io.stdout[0]).toBe(expected);
      expect(log).toEqual([`${action} ${name}`, 'close']);
    }
  });

  test('a Cloud Tasks error is reported with the queue named, and the client still closed', async () => {
    const { admin, log } = fakeAdmin(new Error('7 PERMISSION_DENIED: The principal lacks cloudtasks.queues.pause'));
    await expect(queueCommand(deployed, bufferedIo(), { name: 'queue', action: 'pause' }, () => Promise.resolve(admin))).rejects.toThrow(
      `queue pause on ${name} failed: 7 PERMISSION_DENIED: The principal lacks cloudtasks.queues.pause`,
    );
    expect(log).toEqual([`pause ${name}`, 'close']);
  });

  test('under the emulator no client is even opened', async () => {
    let opened = false;
    const open = () => {
      opened = true;
      return Promise.resolve(fakeAdmin().admin);
    };
    await expect(queueCommand(resolveTarget({}, {}), bufferedIo(), { name: 'queue', action: 'resume' }, open)).rejects.toThrow(/^`phaseline queue resume` is not available under the emulator/);
    expect(opened).toBe(false);
  });
});
