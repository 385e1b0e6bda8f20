/**
 * Agent sections on the real engine and the official Firestore emulator, under the failures a
 * section meets in production: a worker killed between the tool calls of one model turn (bug 3),
 * a provider slower than the step (bug 11), a provider asking for a delay of a day or a century
 * (bug 4). Time is the harness's manual clock; a killed worker is a step that never returns.
 */
import type { ModelProvider, ToolCall } from '../../functions/src/agent/provider';
import type { SectionPolicy } from '../../functions/src/agent/section-runner';
import type { Toolbox, ToolResult } from '../../functions/src/agent/tools';
import type { Clock } from '../../functions/src/core/clock';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { sweep } from '../../functions/src/engine/sweeper';
import { createResearchPipeline, type ResearchDeps } from '../../functions/src/pipelines/research';
import { createCorpusToolbox, createOfflineProvider, type Sleep } from '../../functions/src/providers/offline';
import { createOpenAiCompatibleProvider } from '../../functions/src/providers/openai-compatible';
import { groupPosition } from '../../functions/src/providers/offline/toolbox';
import { decodeJob } from '../../functions/src/store/codec';
import { JOBS } from '../../functions/src/store/paths';
import { firestoreCircuit } from '../../functions/src/store/provider-circuit';
import type { Firestore } from 'firebase-admin/firestore';
import { engineHarness, engineSuite, type EngineHarness } from '../support/engine';
import { hangForever, immediateTimers, ObservedProvider } from '../support/research';

/** Decides, before a call runs, whether the worker dies there (it then never returns). */
type KillSwitch = (call: ToolCall) => boolean;

/**
 * The corpus tools with a side effect: every execution is written to a ledger by call ID before
 * the result is handed back, as an email sent or a row inserted would be.
 */
class SideEffectToolbox implements Toolbox {
  readonly executions = new Map<string, number>();
  killBefore: KillSwitch = () => false;
  onKill: () => void = () => undefined;

  constructor(private readonly inner: Toolbox) {}

  get specs() {
    return this.inner.specs;
  }

  execute(call: ToolCall, signal: AbortSignal): Promise<ToolResult> {
    if (this.killBefore(call)) {
      this.onKill();
      return hangForever();
    }
    this.executions.set(call.id, (this.executions.get(call.id) ?? 0) + 1);
    return this.inner.execute(call, signal);
  }

  /** Call IDs executed more than once, with their counts. */
  repeated(): [string, number][] {
    return [...this.executions.entries()].filter(([, count]) => count > 1);
  }
}

interface RecoverySetup {
  readonly provider: ObservedProvider;
  readonly toolbox: SideEffectToolbox;
  readonly registry: ReturnType<typeof pipelineRegistry>;
}

function recoverySetup(db: Firestore, clock: Clock, options: { sleep?: Sleep; latencyMs?: number; policy?: Partial<SectionPolicy> } = {}): RecoverySetup {
  const provider = new ObservedProvider(
    createOfflineProvider({ seed: 11, clock, settings: { latencyMs: options.latencyMs ?? 0 }, sleep: options.sleep ?? (() => Promise.resolve()) }),
  );
  const toolbox = new SideEffectToolbox(createCorpusToolbox({ seed: 11 }));
  const deps: ResearchDeps = {
    provider,
    toolbox,
    circuit: firestoreCircuit(db, provider.name, { failureThreshold: 3, windowMs: 60_000, coolDownMs: 60_000 }),
    policy: { transientRetries: 1, transientMinDelayMs: 1, transientMaxDelayMs: 5, ...options.policy },
    timers: immediateTimers,
  };
  return { provider, toolbox, registry: pipelineRegistry(createResearchPipeline(() => deps)) };
}

let setup: RecoverySetup;

const harness = engineSuite('agent-recovery', (firestore, clock) => {
  setup = recoverySetup(firestore.db, clock);
  return setup.registry;
}, {
  beforeEach: () => {
    setup.provider.intercept = null;
    setup.provider.requests.length = 0;
    setup.toolbox.executions.clear();
    setup.toolbox.killBefore = () => false;
  },
});

const readJob = async (jobId: string) => decodeJob(jobId, (await harness.firestore.db.doc(`${JOBS}/${jobId}`).get()).data());
// 200 words a section: three documents read per section, often in one turn of three calls.
const question = { question: 'How do leases and fencing tokens keep stale workers from corrupting results?', experts: 2, sections: 2, wordsPerSection: 200 };

/** A one-shot kill switch; `killed` settles when the worker dies. */
function killOnce(): { readonly killed: Promise<void>; readonly kill: () => void; happened: boolean } {
  let kill: () => void = () => undefined;
  const killed = new Promise<void>((resolve) => {
    kill = resolve;
  });
  const state = {
    killed,
    happened: false,
    kill: () => {
      state.happened = true;
      kill();
    },
  };
  return state;
}

/** Runs queued tasks; a task whose worker is killed is abandoned where it stands. */
async function drainSurvivingKill(killed: Promise<void>): Promise<StepOutcome[]> {
  const outcomes: StepOutcome[] = [];
  for (let round = 0; round < 300; round += 1) {
    const next = harness.queue.tasks.shift();
    if (!next) return outcomes;
    harness.clock.advance(next.delaySeconds * 1000);
    const result = await Promise.race([runStep(harness.deps(), next.task), killed.then(() => 'killed' as const)]);
    if (result !== 'killed') outcomes.push(result);
  }
  throw new Error('queue never emptied');
}

async function reclaimAfterLease(): Promise<void> {
  harness.clock.advance(harness.options.leaseSeconds * 1000 + 1);
  await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
}

/** Submits the research question; the worker is killed where `kill` says, the lease expires and the sweeper reclaims it; the rest runs to the end. */
async function submitKilledAndRecovered(kill: { readonly killed: Promise<void>; readonly happened: boolean }): Promise<string> {
  const jobId = await harness.submit('research', question);
  await drainSurvivingKill(kill.killed);
  expect(kill.happened).toBe(true);
  await reclaimAfterLease();
  await harness.drain();
  return jobId;
}

describe('bug 3: a worker killed between the tool calls of one model turn', () => {
  // The offline agent numbers the calls of one turn: `call_<digest>_<position>`, position 0 first.
  test.each([
    ['the first result', 1],
    ['the second result of a turn of three', 2],
  ])('bug 3: killed after %s: the resumed worker runs only the calls without a saved result; no call ID executes twice', async (_label, position) => {
    const kill = killOnce();
    setup.toolbox.killBefore = (call) => !kill.happened && groupPosition(call.id) === position;
    setup.toolbox.onKill = kill.kill;
    const jobId = await submitKilledAndRecovered(kill);

    expect(await readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
    expect(setup.toolbox.executions.size).toBeGreaterThan(6);
    expect(setup.toolbox.repeated()).toEqual([]);
    // The model was never asked again for a turn it had given: no request repeated at all.
    expect(setup.provider.repeatedRequests()).toEqual([]);
  });

  test('bug 3: killed after the last result of a multi-call turn: the group is reused whole and the model call it died in is the only repeat', async () => {
    const kill = killOnce();
    let killedAt = '';
    setup.provider.intercept = (request, call) => {
      const last = request.messages.at(-1);
      const lastTurn = request.messages.findLast((message) => message.role === 'assistant');
      const turnSize = lastTurn?.role === 'assistant' ? (lastTurn.toolCalls?.length ?? 0) : 0;
      if (!kill.happened && last?.role === 'tool' && turnSize >= 2) {
        killedAt = `${request.messages.length}`;
        kill.kill();
        return hangForever();
      }
      return call();
    };
    const jobId = await submitKilledAndRecovered(kill);

    expect(await readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
    expect(setup.toolbox.repeated()).toEqual([]);
    const repeated = setup.provider.repeatedRequests();
    expect(repeated).toHaveLength(1);
    expect(repeated[0]?.endsWith(`@${killedAt}`)).toBe(true);
  });
});

describe('bug 11: a provider slower than the step', () => {
  /** Cloud Functions kills a task handler that runs longer than this (runJobStep's timeout). */
  const FUNCTION_TIMEOUT_MS = 540_000;
  let slowHarness: EngineHarness;
  let slow: RecoverySetup;
  let stepStartedAtMs = 0;
  let platformKill: () => void = () => undefined;

  beforeAll(() => {
    slowHarness = engineHarness('agent-slow', (firestore, clock) => {
      // Model calls take time on the manual clock. A wait that would carry the step past the
      // function timeout is where the platform kills the worker: it never returns.
      const sleep: Sleep = (ms, signal) => {
        signal.throwIfAborted();
        if (clock.now() + ms > stepStartedAtMs + FUNCTION_TIMEOUT_MS) {
          platformKill();
          return hangForever();
        }
        clock.advance(ms);
        return Promise.resolve();
      };
      // 200 s a call, within a 250 s call timeout: three calls would outlive the function.
      slow = recoverySetup(firestore.db, clock, { sleep, latencyMs: 200_000, policy: { callTimeoutMs: 250_000 } });
      return slow.registry;
      // The clock moves inside model calls while heartbeats are held back: a lease and takeover age covering a whole step stand in for a live worker's renewals.
    }, { leaseSeconds: 600, staleHeartbeatSeconds: 600 });
  });
  beforeEach(() => slowHarness.firestore.reset());
  afterAll(() => slowHarness.firestore.close());

  test('bug 11: sections yield before the step deadline and the job completes later: no worker killed, no stale reclaim, never quarantined', async () => {
    const jobId = await slowHarness.submit('research', { ...question, wordsPerSection: 60 });
    let kills = 0;
    let longestStepMs = 0;
    for (let round = 0; round < 400 && slowHarness.queue.tasks.length > 0; round += 1) {
      const next = slowHarness.queue.tasks.shift();
      if (!next) break;
      slowHarness.clock.advance(next.delaySeconds * 1000);
      stepStartedAtMs = slowHarness.clock.now();
      const killed = new Promise<'killed'>((resolve) => {
        platformKill = () => resolve('killed');
      });
      const result = await Promise.race([runStep(slowHarness.deps(), next.task), killed]);
      longestStepMs = Math.max(longestStepMs, slowHarness.clock.now() - stepStartedAtMs);
      if (result === 'killed') {
        // As in production: the lease runs out and the sweeper reclaims the job.
        kills += 1;
        slowHarness.clock.advance(slowHarness.options.leaseSeconds * 1000 + 1);
        await sweep({ store: slowHarness.store, queue: slowHarness.queue, log: () => undefined }, slowHarness.clock.now());
      }
    }

    const job = decodeJob(jobId, (await slowHarness.firestore.db.doc(`${JOBS}/${jobId}`).get()).data());
    expect({ kills, status: job.status, staleReclaims: job.staleReclaims }).toEqual({ kills: 0, status: 'completed', staleReclaims: 0 });
    expect(job.outcome).toBe('complete');
    expect(longestStepMs).toBeLessThanOrEqual(slowHarness.options.stepBudgetSeconds * 1000);
    const events = (await slowHarness.firestore.db.collection(`${JOBS}/${jobId}/events`).get()).docs.map((doc) => doc.get('kind') as string);
    expect(events).toContain('section-yielded');
  });
});

describe('bug 4: a provider asking to wait a day, a century or 10^15 ms', () => {
  const CAP_MS = 900_000;
  let waitHarness: EngineHarness;
  let waiting: RecoverySetup;

  /** The OpenAI-compatible provider, answering 429 with this Retry-After through an injected fetch. */
  const rateLimited = (clock: Clock, retryAfter: string): ModelProvider =>
    createOpenAiCompatibleProvider(
      { baseUrl: 'http://127.0.0.1:9/v1', model: 'm', timeoutMs: 60_000, contextWindowTokens: 128_000, inputUsdPer1kTokens: 0, outputUsdPer1kTokens: 0 },
      { clock, fetch: () => Promise.resolve(new Response('{"error":{"message":"slow down"}}', { status: 429, headers: { 'retry-after': retryAfter } })) },
    );

  beforeAll(() => {
    waitHarness = engineHarness('agent-server-delay', (firestore, clock) => {
      waiting = recoverySetup(firestore.db, clock);
      return waiting.registry;
    });
  });
  beforeEach(async () => {
    waiting.provider.intercept = null;
    await waitHarness.firestore.reset();
  });
  afterAll(() => waitHarness.firestore.close());

  test.each([
    ['86400 s', '86400'],
    ['an HTTP date in 2100', 'Fri, 01 Jan 2100 00:00:00 GMT'],
    ['10^15 ms', '1000000000000'],
  ])('bug 4: Retry-After of %s: the job waits for the provider until now + the cap (a valid time), then resumes and completes', async (_label, retryAfter) => {
    const clock = waitHarness.clock;
    const outageEndsAtMs = clock.now() + 5 * 60_000;
    const limited = rateLimited(clock, retryAfter);
    waiting.provider.intercept = (request, call) => (clock.now() < outageEndsAtMs ? limited.chat(request) : call());
    const jobId = await waitHarness.submit('research', question);

    const startedAtMs = clock.now();
    await waitHarness.drain();
    const parked = decodeJob(jobId, (await waitHarness.firestore.db.doc(`${JOBS}/${jobId}`).get()).data());
    expect(parked.status).toBe('waiting');
    expect(parked.waiting).toMatchObject({ reason: 'provider', untilMs: startedAtMs + CAP_MS });
    expect(parked.waiting?.question).toContain('asked to wait');
    expect(parked.waiting?.question).toContain(`resumes by itself at ${new Date(startedAtMs + CAP_MS).toISOString()}`);
    expect(parked.nextRunAtMs).toBe(startedAtMs + CAP_MS);
    expect(parked.attempts).toBe(0);

    // The cap passes (the outage is over by then); the sweeper resumes the job.
    clock.advance(CAP_MS + 1);
    await sweep({ store: waitHarness.store, queue: waitHarness.queue, log: () => undefined }, clock.now());
    await waitHarness.drain();
    const done = decodeJob(jobId, (await waitHarness.firestore.db.doc(`${JOBS}/${jobId}`).get()).data());
    expect(done).toMatchObject({ status: 'completed', outcome: 'complete', staleReclaims: 0 });
  });
});
