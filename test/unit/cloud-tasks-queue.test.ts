/**
 * The Cloud Tasks adapter, against a local stand-in for the tasks emulator's HTTP endpoint: what
 * each enqueue asks of Cloud Tasks (its name, its delay, its dispatch deadline).
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { deleteApp, initializeApp, type App } from 'firebase-admin/app';
import { cloudTasksQueue, STEP_DISPATCH_DEADLINE_SECONDS, STEP_TIMEOUT_SECONDS } from '../../functions/src/store/cloud-tasks-queue';

interface Received {
  readonly path: string;
  readonly task: Record<string, unknown>;
}

let server: Server;
let app: App;
const received: Received[] = [];
const savedHost = process.env.CLOUD_TASKS_EMULATOR_HOST;

beforeAll(async () => {
  server = createServer((request, response) => {
    let body = '';
    request.on('data', (chunk: Buffer) => (body += chunk.toString()));
    request.on('end', () => {
      const parsed = JSON.parse(body) as { task: Record<string, unknown> };
      received.push({ path: request.url ?? '', task: parsed.task });
      response.writeHead(200, { 'content-type': 'application/json' });
      response.end(JSON.stringify(parsed.task));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  process.env.CLOUD_TASKS_EMULATOR_HOST = `127.0.0.1:${(server.address() as AddressInfo).port}`;
  app = initializeApp({ projectId: 'demo-cloud-tasks-queue', serviceAccountId: 'steps@demo-cloud-tasks-queue.iam.gserviceaccount.com' }, 'cloud-tasks-queue-test');
});

afterAll(async () => {
  await deleteApp(app);
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (savedHost === undefined) delete process.env.CLOUD_TASKS_EMULATOR_HOST;
  else process.env.CLOUD_TASKS_EMULATOR_HOST = savedHost;
});

beforeEach(() => received.splice(0));

describe('cloudTasksQueue', () => {
  test('every task is named, and its dispatch deadline outlasts the step function, so a running step is never dispatched twice', async () => {
    await cloudTasksQueue(app).enqueue({ jobId: 'job-1', step: 3 }, { id: 'job-1-step-3' });
    expect(received).toHaveLength(1);
    const [{ path, task }] = received as [Received];
    expect(path).toContain('/queues/runJobStep/tasks');
    expect(String(task.name)).toMatch(/\/tasks\/job-1-step-3$/);
    expect(task.dispatchDeadline).toBe(`${STEP_DISPATCH_DEADLINE_SECONDS}s`);
    expect(STEP_DISPATCH_DEADLINE_SECONDS).toBeGreaterThan(STEP_TIMEOUT_SECONDS);
    expect(task.scheduleTime).toBeUndefined();
  });

  test('a delayed hand-off is scheduled that many whole seconds later', async () => {
    const before = Date.now();
    await cloudTasksQueue(app).enqueue({ jobId: 'job-2', step: 1 }, { id: 'job-2-step-1', delaySeconds: 2.2 });
    const scheduled = Date.parse(String((received[0] as Received).task.scheduleTime));
    expect(scheduled - before).toBeGreaterThanOrEqual(3000 - 50);
    expect(scheduled - before).toBeLessThan(3000 + 5000);
  });
});

describe('the step function as deployed', () => {
  test("its queue takes its dispatch limits from the environment, and Cloud Tasks' deadline outlasts its timeout", () => {
    const saved = process.env.PHASELINE_STEP_QUEUE_CONCURRENCY;
    process.env.PHASELINE_STEP_QUEUE_CONCURRENCY = '24';
    try {
      jest.isolateModules(() => {
        // eslint-disable-next-line @typescript-eslint/no-require-imports -- loaded as the functions emulator and deploy load it, with this environment
        const { runJobStep } = require('../../functions/src/index') as typeof import('../../functions/src/index');
        const endpoint = runJobStep.__endpoint;
        expect(endpoint.taskQueueTrigger?.rateLimits).toEqual({ maxConcurrentDispatches: 24, maxDispatchesPerSecond: 50 });
        expect(endpoint.timeoutSeconds).toBe(STEP_TIMEOUT_SECONDS);
      });
    } finally {
      if (saved === undefined) delete process.env.PHASELINE_STEP_QUEUE_CONCURRENCY;
      else process.env.PHASELINE_STEP_QUEUE_CONCURRENCY = saved;
    }
  });
});
