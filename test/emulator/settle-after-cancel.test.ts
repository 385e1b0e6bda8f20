/**
 * A job cancelled with an effect in flight, and the check of its effects afterwards (a 200-job
 * chaos soak once ended with such an entry still `unknown` and no check due). On the official
 * Firestore emulator.
 *
 * 1. Conditioned commits from a remembered record do not drop `effectsToSettleAt`: the
 *    mark the ledger writes with a direct update, and the one a cancel writes from another process,
 *    both survive the holder's later commits (its remembered update time no longer matches).
 * 2. What does leave the entry unknown with no check due: the sweeper's recheck of a target that
 *    cannot answer is pushed "as long again as the job has been stopped" (settleRecheckAtMs), so a
 *    failed lookup a few minutes after the cancel moves the next check past the soak's final pass,
 *    then dated only one grace period past the end; that pass found nothing and reported 0 pending.
 *    The soak's final pass now looks past the longest recheck (scripts/chaos/run.ts).
 */
import { OwnershipLostError } from '../../functions/src/core/errors';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { DEFAULT_SETTLE_GRACE_MS, MAX_SETTLE_RECHECK_MS } from '../../functions/src/effects/after-stop';
import { createHttpEffectAdapter } from '../../functions/src/effects/http-adapter';
import { effectEntrySchema, type EffectEntry } from '../../functions/src/effects/ledger';
import { cancelJob } from '../../functions/src/engine/owner-actions';
import { runStep } from '../../functions/src/engine/step';
import { settleStoppedEffects, type SettleStoppedReport } from '../../functions/src/engine/settle-stopped';
import { sweep, type SweepReport } from '../../functions/src/engine/sweeper';
import { notifyStoppedEffects } from '../../functions/src/pipelines/notify';
import { decodeJob } from '../../functions/src/store/codec';
import { JobStore } from '../../functions/src/store/job-store';
import { JOBS } from '../../functions/src/store/paths';
import { engineSuite, gate } from '../support/engine';
import { eventually, httpAdapter, notifySetup, startReceiver, type Receiver } from '../support/receiver';

let receiver: Receiver;
const notify = notifySetup(() => receiver);

const harness = engineSuite('settle-after-cancel', pipelineRegistry(...([...notify.registry.values()] as [never])), {
  beforeEach: async () => {
    receiver = await startReceiver(harness.clock);
    notify.deps.current = { adapter: httpAdapter(receiver), unavailableWaitMs: 60_000 };
  },
  afterEach: () => receiver.stop(),
});

const GRACE_MS = DEFAULT_SETTLE_GRACE_MS;
const db = () => harness.firestore.db;
const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
const rawSettleAt = async (jobId: string): Promise<unknown> => (await db().doc(`${JOBS}/${jobId}`).get()).get('effectsToSettleAt');
const entry = async (jobId: string, key: string): Promise<EffectEntry> => effectEntrySchema.parse((await db().doc(`${JOBS}/${jobId}/effects/${key}`).get()).data());

/** Each role in its own process, as in the soak: its own JobStore, so its own remembered owner views. */
const newStore = () => new JobStore(harness.firestore.db, harness.clock, harness.options);

function sweepAt(store: JobStore, nowMs: number): Promise<SweepReport> {
  harness.clock.set(nowMs);
  return sweep({ store, queue: harness.queue, log: () => undefined, stoppedEffects: { settlerFor: notifyStoppedEffects(() => notify.deps.current) } }, nowMs);
}

/** The soak's final pass (scripts/chaos/run.ts): one grace period and a second ahead, then an hour more only if that one left something pending. */
async function soakFinalPasses(store: JobStore, endMs: number): Promise<SettleStoppedReport[]> {
  const reports: SettleStoppedReport[] = [];
  for (const aheadMs of [GRACE_MS + 1_000, MAX_SETTLE_RECHECK_MS + GRACE_MS + 1_000]) {
    const report = await settleStoppedEffects({ store, stoppedEffects: { settlerFor: notifyStoppedEffects(() => notify.deps.current) }, log: () => undefined }, endMs + aheadMs);
    reports.push(report);
    if (report.pending === 0 && report.errors === 0) break;
  }
  return reports;
}

/**
 * A notify job whose send step (run by `workerStore`, another process) holds its first message at
 * the receiver, applied but unanswered: the ledger entry is `applying`, sent with "sending to ...".
 */
async function jobWithFirstMessageInFlight(workerStore: JobStore, hold: Promise<void>) {
  const jobId = await harness.submit('notify', { campaign: 'Renewal', recipients: 2 }, 'owner-1');
  const [plan] = harness.queue.drain();
  expect((await runStep(harness.deps('worker-plan', { store: workerStore }), plan!.task)).kind).toBe('handed-off');
  notify.deps.current = { ...notify.deps.current, adapter: createHttpEffectAdapter({ baseUrl: receiver.url, timeoutMs: 120_000, name: 'the test receiver' }) };
  let inFlight: string | null = null;
  receiver.afterApply = async (application) => {
    if (application.kind === 'message' && inFlight === null) {
      inFlight = application.key;
      await hold;
    }
  };
  const [send] = harness.queue.drain();
  const worker = runStep(harness.deps('worker-send', { store: workerStore }), send!.task);
  await eventually(() => inFlight !== null, 'the first message is in flight');
  return { jobId, worker, key: () => inFlight ?? '' };
}

test('a holder\'s commits from its remembered record keep the ledger\'s effectsToSettleAt mark and the cancel\'s (conditioned commits drop neither)', async () => {
  const workerStore = newStore();
  const apiStore = newStore();
  const hold = gate();
  const { jobId, worker, key } = await jobWithFirstMessageInFlight(workerStore, hold.promise);
  expect((await entry(jobId, key())).state).toBe('applying');
  const running = await readJob(jobId);
  expect(running.status).toBe('running');
  const markedAtMs = running.effectsToSettleAtMs;
  expect(markedAtMs).not.toBeNull(); // the ledger's direct update, in the transaction that moved the entry to applying
  const claim = { jobId, epoch: running.epoch };

  // The holder commits (a heartbeat-like change) and then remembers that commit's record and update time.
  await workerStore.asOwner(claim, ({ job }) => Promise.resolve({ next: { ...job, progress: { ...job.progress, probe: 1 } }, value: undefined }));
  expect((await readJob(jobId)).effectsToSettleAtMs).toBe(markedAtMs);
  // A second commit from the remembered view (no read): still nothing dropped.
  await workerStore.asOwner(claim, ({ job }) => Promise.resolve({ next: { ...job, progress: { ...job.progress, probe: 2 } }, value: undefined }));
  expect((await readJob(jobId)).effectsToSettleAtMs).toBe(markedAtMs);

  // The owner cancels from another process: the in-flight entry becomes unknown, the check is due one grace period on.
  const cancelAtMs = harness.clock.now();
  const { unknownEffects } = await cancelJob(apiStore, { jobId, owner: 'owner-1', reason: 'wrong list' });
  expect(unknownEffects).toBe(1);
  expect((await readJob(jobId)).effectsToSettleAtMs).toBe(cancelAtMs + GRACE_MS);

  // The holder's next commit starts from its remembered record (from before the cancel): the precondition fails, it reads, it is refused.
  const seen: string[] = [];
  await expect(
    workerStore.asOwner(claim, ({ job }) => {
      seen.push(job.status);
      return Promise.resolve({ next: { ...job, effectsToSettleAtMs: null, progress: { ...job.progress, probe: 3 } }, value: undefined });
    }),
  ).rejects.toBeInstanceOf(OwnershipLostError);
  // The body ran once, on the remembered record from before the cancel; its commit was refused by the precondition.
  expect(seen).toEqual(['running']);
  hold.open();
  expect((await worker).kind).toBe('ownership-lost');
  const cancelled = await readJob(jobId);
  expect(cancelled).toMatchObject({ status: 'cancelled', effectsToSettleAtMs: cancelAtMs + GRACE_MS, progress: { probe: 2 } });
  expect(await entry(jobId, key())).toMatchObject({ state: 'unknown', lastOutcome: 'sending to the test receiver' });

  // And the sweeper settles it on time.
  expect((await sweepAt(newStore(), cancelAtMs + GRACE_MS)).stoppedEffects).toMatchObject({ checked: 1, settled: 1, effectsFoundApplied: 1 });
  expect(await entry(jobId, key())).toMatchObject({ state: 'applied', reconciled: true });
  expect(await rawSettleAt(jobId)).toBeNull();
});

test('lookups that fail after a cancel move the next check out as long again as the job has been stopped: a pass an hour later settles it', async () => {
  const workerStore = newStore();
  const sweeperStore = newStore();
  const hold = gate();
  const { jobId, worker, key } = await jobWithFirstMessageInFlight(workerStore, hold.promise);
  // As in the soak's timeline: cancel at 10:13.2 (613.2 s), the soak ends at about 18:48 (1128 s).
  const cancelAtMs = harness.clock.now();
  const endMs = cancelAtMs + 514_800;
  await cancelJob(newStore(), { jobId, owner: 'owner-1', reason: 'owner-cancel' });
  hold.open();
  expect((await worker).kind).toBe('ownership-lost');
  expect(await entry(jobId, key())).toMatchObject({ state: 'unknown', lastOutcome: 'sending to the test receiver' });
  expect((await readJob(jobId)).effectsToSettleAtMs).toBe(cancelAtMs + GRACE_MS);

  // Receiver faults (an outage, or the lookups armed to fail by an apply-then-hang fault): every check is pushed
  // "as long again as the job has been stopped" (settleRecheckAtMs): +60 s, +120 s, ...
  receiver.inject({ op: 'lookup', mode: 'unavailable', times: Number.POSITIVE_INFINITY });
  expect((await sweepAt(sweeperStore, cancelAtMs + GRACE_MS)).stoppedEffects).toMatchObject({ checked: 1, pending: 1, settled: 0 });
  expect((await readJob(jobId)).effectsToSettleAtMs).toBe(cancelAtMs + 2 * GRACE_MS);
  expect((await sweepAt(sweeperStore, cancelAtMs + 2 * GRACE_MS)).stoppedEffects).toMatchObject({ checked: 1, pending: 1 });
  expect((await readJob(jobId)).effectsToSettleAtMs).toBe(cancelAtMs + 4 * GRACE_MS);
  // The check due at +240 s runs in a pass that starts at +300 s (soak passes wait up to a minute on a locked
  // document), still during the faults: the next check is another 300 s on, at +600 s (soak 20:13).
  const latePassMs = cancelAtMs + 300_000;
  expect((await sweepAt(sweeperStore, latePassMs)).stoppedEffects).toMatchObject({ checked: 1, pending: 1 });
  const nextCheckMs = (await readJob(jobId)).effectsToSettleAtMs ?? 0;
  expect(nextCheckMs).toBe(cancelAtMs + 600_000);

  // The faults stop. Every later regular pass, up to the end, finds nothing due.
  receiver.clearFaults();
  expect((await sweepAt(sweeperStore, endMs)).stoppedEffects).toMatchObject({ queryDocuments: 0, checked: 0 });

  // The soak's final pass, dated one grace period (and a second) past the end: 575.8 s after the cancel < 600 s.
  const finals = await soakFinalPasses(sweeperStore, endMs);
  expect(finals).toHaveLength(1); // 0 pending, 0 errors: the hour-ahead pass is skipped
  expect(finals[0]).toMatchObject({ checked: 0, settled: 0, pending: 0, errors: 0, queryDocuments: 0 });
  // What the soak's invariant then reads: a cancelled job whose in-flight effect is still unknown ...
  const stuck = await readJob(jobId);
  expect(stuck).toMatchObject({ status: 'cancelled', effectsToSettleAtMs: cancelAtMs + 600_000, cancellation: { effects: { settled: false } } });
  expect(await entry(jobId, key())).toMatchObject({ state: 'unknown', lastOutcome: 'sending to the test receiver' });
  expect(receiver.requests.filter((request) => request.op === 'lookup')).toHaveLength(3);
  // ... with its check still set, not lost: due 24.2 s after the final pass's "now".
  expect(nextCheckMs - (endMs + GRACE_MS + 1_000)).toBe(24_200);

  // A pass dated past the longest recheck (as the soak's second pass would be) settles it.
  const late = await settleStoppedEffects({ store: sweeperStore, stoppedEffects: { settlerFor: notifyStoppedEffects(() => notify.deps.current) }, log: () => undefined }, endMs + MAX_SETTLE_RECHECK_MS + GRACE_MS + 1_000);
  expect(late).toMatchObject({ checked: 1, settled: 1, pending: 0, effectsFoundApplied: 1 });
  expect(await entry(jobId, key())).toMatchObject({ state: 'applied', reconciled: true });
  expect((await readJob(jobId)).effectsToSettleAtMs).toBeNull();
});
