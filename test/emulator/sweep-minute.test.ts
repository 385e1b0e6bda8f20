/**
 * Recovery within 30 s on the defaults (issue 28): one scheduled run sweeps in full at its schedule
 * time, then looks for expired leases and lost tasks every `sweepIntervalSeconds` until its minute
 * is over. A frozen worker (its request open, no task coming back) is reclaimed at most lease +
 * interval after its last renewal; a live worker heartbeating across the whole minute never is.
 * Clock injected: the run's wait moves the clock, nothing sleeps.
 */
import { DEFAULT_SETTLE_GRACE_MS } from '../../functions/src/effects/after-stop';
import type { EffectAdapter } from '../../functions/src/effects/port';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { cancelJob } from '../../functions/src/engine/owner-actions';
import { SETTLE_CONCURRENCY } from '../../functions/src/engine/settle-stopped';
import { runStep } from '../../functions/src/engine/step';
import { sweepMinute, type SweepMinuteDeps, type Wait } from '../../functions/src/engine/sweep-minute';
import { firestoreEffectLedger } from '../../functions/src/store/firestore-ledger';
import { gate, engineSuite, waitUntil } from '../support/engine';
import { behaviour, testPipeline } from '../support/test-pipeline';
import { ManualTimers } from '../support/timers';

const harness = engineSuite('sweep-minute', pipelineRegistry(testPipeline));

const readJob = (jobId: string) => harness.readJob(jobId);
const neverReturns = () => new Promise<never>(() => undefined);
const movesTheClock: Wait = (ms) => {
  harness.clock.advance(ms);
  return Promise.resolve();
};
const minuteDeps = (wait: Wait = movesTheClock, stoppedEffects?: SweepMinuteDeps['stoppedEffects']): SweepMinuteDeps => ({
  store: harness.store,
  queue: harness.queue,
  log: () => undefined,
  clock: harness.clock,
  wait,
  ...(stoppedEffects ? { stoppedEffects } : {}),
});

/**
 * A job whose worker was sending an effect (`applying`) when its owner cancelled it: the effect is
 * unknown, for the sweeper's stopped-effects pass to look up once the grace period is over. Its
 * worker stays parked in the phase (its request open). Set `behaviour.first` to park it first.
 */
async function stoppedWithUnknownEffect(name: string): Promise<string> {
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const [task] = harness.queue.drain();
  void runStep(harness.deps(name, { timers: new ManualTimers() }), task!.task);
  await waitUntil(async () => (await readJob(jobId)).lease?.worker === name);
  const claim = { jobId, epoch: (await readJob(jobId)).epoch };
  const ledger = firestoreEffectLedger({ db: harness.firestore.db, jobId, unit: null, epoch: claim.epoch, clock: harness.clock, signal: new AbortController().signal, commit: (decide) => harness.store.apply({ kind: 'job', claim }, decide) });
  const [planned] = await ledger.plan([{ kind: 'email', identity: `welcome-${name}`, target: 'mailto:someone@example.com', payload: { subject: 'hello' } }]);
  await ledger.transition(planned!.key, ['planned'], { state: 'applying', countAttempt: true, lastOutcome: 'sending' });
  await cancelJob(harness.store, { jobId, owner: 'user-1', reason: 'not needed' });
  return jobId;
}

/** A receiver whose every lookup runs `lookup` first and then finds nothing (the sweeper sends nothing). */
function receiverLookingUp(lookup: () => Promise<void> | void = () => undefined): EffectAdapter {
  return {
    name: 'a slow receiver',
    sendTimeoutMs: 1_000,
    apply: () => Promise.reject(new Error('the sweeper sends nothing')),
    lookup: async () => {
      await lookup();
      return { kind: 'not-found' };
    },
  };
}

const parkedInItsPhase = () => {
  behaviour.first = () => neverReturns();
};

/** A job its frozen worker holds (its request open, its timers never firing, no task coming back); resolves once it holds the lease. */
async function frozenHolder(name: string): Promise<{ jobId: string; renewedAtMs: number }> {
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const [task] = harness.queue.drain();
  void runStep(harness.deps(name, { timers: new ManualTimers() }), task!.task);
  await waitUntil(async () => (await readJob(jobId)).lease?.worker === name);
  return { jobId, renewedAtMs: (await readJob(jobId)).lease?.renewedAtMs ?? Number.NaN };
}

test('the defaults bound a frozen worker\'s recovery: 20 s lease, passes every 5 s', () => {
  expect(harness.options).toMatchObject({ leaseSeconds: 20, sweepIntervalSeconds: 5, heartbeatSeconds: 5, staleHeartbeatSeconds: 10, lostTaskGraceSeconds: 20 });
});

test('a frozen worker\'s job is reclaimed by the first pass after its lease ran out, within 25 s of its last renewal, and the next claim runs it', async () => {
  let runs = 0;
  behaviour.first = async (context) => {
    runs += 1;
    // The first worker freezes: its request stays open, its timers never fire, no task comes back.
    if (runs === 1) await neverReturns();
    return { kind: 'done', state: { sections: context.input.sections } };
  };
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const [task] = harness.queue.drain();
  void runStep(harness.deps('frozen', { timers: new ManualTimers() }), task!.task);
  await waitUntil(async () => (await readJob(jobId)).lease?.worker === 'frozen');
  const renewedAtMs = (await readJob(jobId)).lease?.renewedAtMs ?? Number.NaN;

  const scheduledAtMs = harness.clock.now();
  const { full, recovery } = await sweepMinute(minuteDeps(), scheduledAtMs);

  expect(full.reclaimed).toBe(0);
  // Every interval until one interval before the next run: 11 passes after the full sweep, on the grid.
  expect(recovery.map((pass) => pass.nowMs - scheduledAtMs)).toEqual([5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55].map((seconds) => seconds * 1000));
  const reclaiming = recovery.filter((pass) => pass.reclaimed > 0);
  expect(reclaiming).toHaveLength(1);
  const reclaimedAfterMs = reclaiming[0]!.nowMs - renewedAtMs;
  expect(reclaimedAfterMs).toBeGreaterThanOrEqual(harness.options.leaseSeconds * 1000);
  expect(reclaimedAfterMs).toBeLessThanOrEqual((harness.options.leaseSeconds + harness.options.sweepIntervalSeconds) * 1000);
  expect(await readJob(jobId)).toMatchObject({ status: 'queued', staleReclaims: 1, lease: null });

  // The reclaim's task is the next claim: it runs the phase the frozen worker held.
  const [next] = harness.queue.drain();
  expect(await runStep(harness.deps('next'), next!.task)).toMatchObject({ kind: 'handed-off', phase: 'first' });
  expect(runs).toBe(2);
});

test('a live worker heartbeating every 5 s through a whole minute of passes keeps its job (20 s lease)', async () => {
  const timers = new ManualTimers();
  const release = gate();
  const entered = gate();
  behaviour.first = async (context) => {
    entered.open();
    await release.promise;
    return { kind: 'done', state: { sections: context.input.sections } };
  };
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const [task] = harness.queue.drain();
  const worker = runStep(harness.deps('live', { timers }), task!.task);
  await entered.promise;
  // The worker's heartbeats run while the sweeper waits between passes.
  const heartbeatMs = harness.options.heartbeatSeconds * 1000;
  const withHeartbeats: Wait = async (ms) => {
    for (let left = ms; left > 0; left -= heartbeatMs) {
      harness.clock.advance(Math.min(heartbeatMs, left));
      // The heartbeat re-arms after its last flush settled: fire it only once it is set again.
      await waitUntil(() => Promise.resolve(timers.size > 0));
      timers.fireAll();
      const now = harness.clock.now();
      await waitUntil(async () => (await readJob(jobId)).lease?.renewedAtMs === now);
    }
  };
  const { full, recovery } = await sweepMinute(minuteDeps(withHeartbeats), harness.clock.now());
  expect(recovery).toHaveLength(11);
  expect([full, ...recovery].map((pass) => pass.reclaimed)).toEqual(new Array(12).fill(0));
  release.open();
  expect(await worker).toMatchObject({ kind: 'handed-off', phase: 'first' });
  expect((await readJob(jobId)).staleReclaims).toBe(0);
});

test('a run delivered after its minute is over does its full sweep alone, and a pass that overran skips the slots it missed', async () => {
  const late = await sweepMinute(minuteDeps(), harness.clock.now() - 61_000);
  expect(late.recovery).toEqual([]);

  // The first wait overshoots by 12 s (a slow pass or a late timer): the slots at 5 and 10 s are behind the clock.
  let first = true;
  const overshootsOnce: Wait = (ms) => {
    harness.clock.advance(ms + (first ? 12_000 : 0));
    first = false;
    return Promise.resolve();
  };
  const scheduledAtMs = harness.clock.now();
  const { recovery } = await sweepMinute(minuteDeps(overshootsOnce), scheduledAtMs);
  // The overshot pass decides at its slot (5 s), never ahead of it; the next is the first slot not yet past.
  expect(recovery.map((pass) => (pass.nowMs - scheduledAtMs) / 1000)).toEqual([5, 20, 25, 30, 35, 40, 45, 50, 55]);
});

test('bug 46: a full sweep slowed by a stopped job\'s effect lookup (40 s at its receiver) holds up no recovery pass: every slot of the minute runs, and a frozen worker\'s lease is reclaimed within 25 s of its last renewal', async () => {
  parkedInItsPhase();
  const stoppedId = await stoppedWithUnknownEffect('sender');
  harness.clock.advance(DEFAULT_SETTLE_GRACE_MS + 1_000);

  // The minute's own waits move the clock; the receiver answers a lookup once 40 s of that clock have passed.
  // (Were the minute waiting on the lookup, nothing would move the clock: the receiver's 40 s then pass by themselves.)
  let timelineRunning = false;
  const clockWaiters: { atMs: number; resolve: () => void }[] = [];
  const wait: Wait = (ms) => {
    timelineRunning = true;
    harness.clock.advance(ms);
    for (const waiter of clockWaiters.splice(0)) {
      if (waiter.atMs <= harness.clock.now()) waiter.resolve();
      else clockWaiters.push(waiter);
    }
    return Promise.resolve();
  };
  const LOOKUP_MS = 40_000;
  let lookups = 0;
  const slowReceiver = receiverLookingUp(async () => {
    lookups += 1;
    const answerAtMs = harness.clock.now() + LOOKUP_MS;
    if (timelineRunning) await new Promise<void>((resolve) => clockWaiters.push({ atMs: answerAtMs, resolve }));
    else harness.clock.advance(LOOKUP_MS);
  });

  const { jobId, renewedAtMs } = await frozenHolder('frozen');
  const scheduledAtMs = harness.clock.now();
  const { full, recovery } = await sweepMinute(minuteDeps(wait, { settlerFor: () => ({ adapter: slowReceiver }) }), scheduledAtMs);

  expect(recovery.map((pass) => (pass.nowMs - scheduledAtMs) / 1000)).toEqual([5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55]);
  const reclaiming = recovery.filter((pass) => pass.reclaimed > 0);
  expect(reclaiming).toHaveLength(1);
  expect(reclaiming[0]!.nowMs - renewedAtMs).toBeLessThanOrEqual((harness.options.leaseSeconds + harness.options.sweepIntervalSeconds) * 1000);
  expect(await readJob(jobId)).toMatchObject({ status: 'queued', staleReclaims: 1, lease: null });
  // The slow part still ran in that minute: the effect was looked up and the stopped job's counts are final.
  expect(lookups).toBe(1);
  expect(full.stoppedEffects).toMatchObject({ checked: 1, settled: 1, effectsNotApplied: 1, carriedOver: 0 });
  expect((await readJob(stoppedId)).effectsToSettleAtMs).toBeNull();
});

test('the slow part of a full sweep starts no stopped job\'s lookup after the minute\'s last slot: the jobs left stay due for the next run', async () => {
  parkedInItsPhase();
  // One more than the pass checks at once (SETTLE_CONCURRENCY): the last job's turn comes once a lookup is over.
  const stoppedIds: string[] = [];
  for (let index = 0; index <= SETTLE_CONCURRENCY; index += 1) stoppedIds.push(await stoppedWithUnknownEffect(`sender-${index}`));
  harness.clock.advance(DEFAULT_SETTLE_GRACE_MS + 1_000);
  // Each lookup takes the rest of the minute (the clock jumps past its last slot): the last job's turn comes after it.
  const scheduledAtMs = harness.clock.now();
  const slowReceiver = receiverLookingUp(() => harness.clock.set(Math.max(harness.clock.now(), scheduledAtMs + 56_000)));
  const { full } = await sweepMinute(minuteDeps(movesTheClock, { settlerFor: () => ({ adapter: slowReceiver }) }), scheduledAtMs);
  expect(full.stoppedEffects).toMatchObject({ checked: SETTLE_CONCURRENCY, settled: SETTLE_CONCURRENCY, carriedOver: 1 });
  // Its query and the two after it were not finished: the next run goes on with them.
  expect(full.stoppedEffects.truncated).toEqual(['cancelledEffectsToSettle', 'failedEffectsToSettle', 'quarantinedEffectsToSettle']);
  const due = await Promise.all(stoppedIds.map(async (id) => (await readJob(id)).effectsToSettleAtMs ?? null));
  expect(due.filter((atMs) => atMs === null)).toHaveLength(SETTLE_CONCURRENCY);
  expect(due.filter((atMs) => atMs !== null && atMs <= harness.clock.now())).toHaveLength(1);
});

test('a run delivered after its minute is over still looks up stopped jobs\' effects (for one interval)', async () => {
  parkedInItsPhase();
  const stoppedId = await stoppedWithUnknownEffect('sender');
  // Scheduled past the job's grace period, delivered more than a minute later.
  harness.clock.advance(DEFAULT_SETTLE_GRACE_MS + 1_000 + 61_000);
  const { full, recovery } = await sweepMinute(minuteDeps(movesTheClock, { settlerFor: () => ({ adapter: receiverLookingUp() }) }), harness.clock.now() - 61_000);
  expect(recovery).toEqual([]);
  expect(full.stoppedEffects).toMatchObject({ checked: 1, settled: 1, carriedOver: 0 });
  expect((await readJob(stoppedId)).effectsToSettleAtMs).toBeNull();
});
