/**
 * Effects a job left in flight or unknown when it stopped (a cancel, the owner's "stop here", a
 * quarantine) are settled by the sweeper alone: `sweep()` with the pipeline's effect adapter asks
 * the local receiver (the system of record) once the grace period is over, and the job's structured
 * effect counts become final and agree with the receiver. On the official Firestore emulator.
 */
import { DEFAULT_SETTLE_GRACE_MS, MAX_SETTLE_RECHECK_MS } from '../../functions/src/effects/after-stop';
import { effectEntrySchema, IN_FLIGHT_MARGIN_MS, inFlightGraceMs, type EffectEntry, type EffectIntent } from '../../functions/src/effects/ledger';
import { createHttpEffectAdapter } from '../../functions/src/effects/http-adapter';
import type { EffectAdapter } from '../../functions/src/effects/port';
import { cancellationReport } from '../../functions/src/effects/stop-report';
import { cancelJob, decideJob } from '../../functions/src/engine/owner-actions';
import { runStep } from '../../functions/src/engine/step';
import { sweep, type SweepReport } from '../../functions/src/engine/sweeper';
import { buildPlan, notifyInput, notifyStoppedEffects, UNKNOWN_OPTIONS } from '../../functions/src/pipelines/notify';
import { decodeJob } from '../../functions/src/store/codec';
import { JOBS } from '../../functions/src/store/paths';
import { gate } from '../support/engine';
import { eventually, httpAdapter, notifySuite } from '../support/receiver';
import { hangForever } from '../support/research';
import { dyingInsideItsChange } from '../support/dead-client';
import { OwnershipLostError } from '../../functions/src/core/errors';
import { settleStoppedEffects, type SettleStoppedReport } from '../../functions/src/engine/settle-stopped';
import { JobStore } from '../../functions/src/store/job-store';

// The first expired lease quarantines, so a worker lost mid-apply leaves a quarantined job behind.
const { harness, notify, receiver } = notifySuite('stopped-effects', { options: { maxStaleReclaims: 0 } });

const GRACE_MS = DEFAULT_SETTLE_GRACE_MS;
/** The held send's deadline: patient enough that the request is still in flight when the cancel lands, however slow the machine. */
const PATIENT_TIMEOUT_MS = 120_000;
const db = () => harness.firestore.db;
const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
const ledger = async (jobId: string): Promise<EffectEntry[]> => (await db().collection(`${JOBS}/${jobId}/effects`).get()).docs.map((doc) => effectEntrySchema.parse(doc.data()));
const entry = async (jobId: string, key: string): Promise<EffectEntry> => effectEntrySchema.parse((await db().doc(`${JOBS}/${jobId}/effects/${key}`).get()).data());
const lookups = () => receiver().requests.filter((request) => request.op === 'lookup').length;
const kinds = (outcomes: readonly { kind: string }[]) => outcomes.map((outcome) => outcome.kind);

/** The sweep as the deployed trigger runs it: with the notify pipeline's effect adapter. */
function sweepAt(nowMs: number): Promise<SweepReport> {
  harness.clock.set(nowMs);
  return sweep({ store: harness.store, queue: harness.queue, log: () => undefined, stoppedEffects: { settlerFor: notifyStoppedEffects(() => notify.deps.current) } }, nowMs);
}

/** Applied keys in the ledger and at the receiver are the same set. */
async function expectLedgerMatchesReceiver(jobId: string): Promise<void> {
  const applied = (await ledger(jobId)).filter((candidate) => candidate.state === 'applied').map((candidate) => candidate.key);
  expect(new Set(applied)).toEqual(new Set(receiver().applied().map((application) => application.key)));
}

/** Submits a notify job, plans it, and starts its send step with the third message held in flight. */
async function cancelWithThirdMessageInFlight(recipients: number, hold: Promise<void>, where: 'after-apply' | 'before-apply') {
  const jobId = await harness.submit('notify', { campaign: 'Renewal', recipients }, 'owner-1');
  expect(kinds(await harness.drain(1))).toEqual(['handed-off']); // the plan
  // Patient enough that the held request is still in flight when the cancel lands, however slow the machine.
  notify.deps.current = { ...notify.deps.current, adapter: createHttpEffectAdapter({ baseUrl: receiver().url, timeoutMs: PATIENT_TIMEOUT_MS, name: 'the test receiver' }) };
  let inFlight: string | null = null;
  if (where === 'after-apply') {
    receiver().afterApply = async (application) => {
      if (application.kind === 'message' && receiver().applied('message').length === 3) {
        inFlight = application.key;
        await hold; // applied at the receiver; the answer is held back
      }
    };
  } else {
    let messages = 0;
    receiver().beforeApply = async ({ kind, key }) => {
      if (kind === 'message' && (messages += 1) === 3) {
        inFlight = key;
        await hold; // held before applying: once released, it fails without applying
      }
    };
  }
  const [task] = harness.queue.drain();
  const worker = runStep(harness.deps(), task!.task);
  await eventually(() => inFlight !== null, 'the third message is in flight');
  const cancelAtMs = harness.clock.now();
  const { job, unknownEffects } = await cancelJob(harness.store, { jobId, owner: 'owner-1', reason: 'wrong list' });
  expect(unknownEffects).toBe(1);
  return { jobId, worker, cancelAtMs, cancelled: job, inFlightKey: () => inFlight ?? '' };
}

test('bug 2: a cancelled job with an in-flight effect is settled by sweep() alone after the grace period, not before, and its counts match the receiver', async () => {
  const hold = gate();
  const { jobId, worker, cancelAtMs, cancelled, inFlightKey } = await cancelWithThirdMessageInFlight(5, hold.promise, 'after-apply');
  expect(cancelled.cancellation?.effects).toEqual({ counts: { planned: 5, applying: 0, applied: 4, unknown: 1, failed: 0 }, settled: false, checkedWith: null, checkedAtMs: null });
  expect(cancellationReport(cancelled.cancellation!)).toContain('Effects: 4 applied, 5 not applied, 1 unknown (being checked).');
  hold.open();
  expect((await worker).kind).toBe('ownership-lost');
  expect(receiver().applied()).toHaveLength(5); // 3 messages, 2 records: the held one did land

  // Within the grace period the sweeper does not even ask.
  for (const atMs of [cancelAtMs, cancelAtMs + GRACE_MS / 2, cancelAtMs + GRACE_MS - 1]) {
    expect((await sweepAt(atMs)).stoppedEffects).toMatchObject({ checked: 0, settled: 0, queryDocuments: 0 });
  }
  expect(lookups()).toBe(0);
  expect((await entry(jobId, inFlightKey())).state).toBe('unknown');
  expect((await readJob(jobId)).cancellation?.effects?.settled).toBe(false);

  // At the end of it, one sweep settles it: found at the receiver, recorded as applied.
  const report = await sweepAt(cancelAtMs + GRACE_MS);
  expect(report.stoppedEffects).toMatchObject({ checked: 1, settled: 1, pending: 0, effectsFoundApplied: 1, effectsNotApplied: 0, errors: 0 });
  expect(await entry(jobId, inFlightKey())).toMatchObject({ state: 'applied', reconciled: true, attempts: 1, unknowns: 1, lookups: 1 });
  const job = await readJob(jobId);
  expect(job.status).toBe('cancelled');
  expect(job.effectsToSettleAtMs).toBeNull();
  expect(job.cancellation?.effects).toEqual({
    counts: { planned: 5, applying: 0, applied: receiver().applied().length, unknown: 0, failed: 0 },
    settled: true,
    checkedWith: 'the test receiver',
    checkedAtMs: cancelAtMs + GRACE_MS,
  });
  expect(cancellationReport(job.cancellation!)).toContain(`Effects: ${receiver().applied().length} applied, 5 not applied, 0 unknown (final, checked with the test receiver).`);
  expect(job.progress).toMatchObject({ total: 5, sent: receiver().applied('message').length, logged: receiver().applied('record').length, unknown: 0 });
  await expectLedgerMatchesReceiver(jobId);

  // Nothing is left to do: later sweeps find no job to read, and ask the receiver nothing more.
  const lookupsAfter = lookups();
  expect((await sweepAt(cancelAtMs + 10 * GRACE_MS)).stoppedEffects).toMatchObject({ queryDocuments: 0, checked: 0 });
  expect(lookups()).toBe(lookupsAfter);
});

test('a stopped-effects pass that dies inside recording what it found (entry read, commit never sent) holds nothing: the next sweep settles the job at once', async () => {
  const hold = gate();
  const { jobId, worker, cancelAtMs, inFlightKey } = await cancelWithThirdMessageInFlight(3, hold.promise, 'after-apply');
  hold.open();
  expect((await worker).kind).toBe('ownership-lost');
  harness.clock.set(cancelAtMs + GRACE_MS);
  // Its first change is the pass's triage; its second records the lookup's answer, and never commits.
  const dying = dyingInsideItsChange(harness.store, 2);
  void sweep({ store: dying.store, queue: harness.queue, log: () => undefined, stoppedEffects: { settlerFor: notifyStoppedEffects(() => notify.deps.current) } }, cancelAtMs + GRACE_MS);
  await dying.decided;

  const report = await sweepAt(cancelAtMs + GRACE_MS);

  expect(report.stoppedEffects).toMatchObject({ checked: 1, settled: 1, effectsFoundApplied: 1, errors: 0 });
  expect(await entry(jobId, inFlightKey())).toMatchObject({ state: 'applied', reconciled: true });
  expect(await readJob(jobId)).toMatchObject({ status: 'cancelled', effectsToSettleAtMs: null, cancellation: { effects: { settled: true } } });
  await expectLedgerMatchesReceiver(jobId);
});

test('bug 2: an in-flight effect the receiver never got is recorded as not applied by sweep() alone after the grace period; bug 26: a cancel cutting it does not shorten its send deadline', async () => {
  const hold = gate();
  const { jobId, worker, cancelAtMs, inFlightKey } = await cancelWithThirdMessageInFlight(3, hold.promise, 'before-apply');
  receiver().inject({ op: 'apply', mode: 'fail-before-apply', times: 1 });
  hold.open();
  expect((await worker).kind).toBe('ownership-lost');
  expect(receiver().applied()).toHaveLength(4); // the first two recipients, sent and logged

  expect((await sweepAt(cancelAtMs + GRACE_MS - 1)).stoppedEffects.checked).toBe(0);
  expect((await entry(jobId, inFlightKey())).state).toBe('unknown');

  // The held request went out under the adapter's 120 s deadline: until that deadline and the margin have passed since the cancel, a lookup that finds nothing writes nothing off.
  const inFlightEndsMs = cancelAtMs + inFlightGraceMs(PATIENT_TIMEOUT_MS);
  expect((await sweepAt(cancelAtMs + GRACE_MS)).stoppedEffects).toMatchObject({ checked: 1, settled: 0, effectsNotApplied: 0 });
  expect((await entry(jobId, inFlightKey())).state).toBe('unknown');
  expect((await readJob(jobId)).effectsToSettleAtMs).toBe(inFlightEndsMs);

  expect((await sweepAt(inFlightEndsMs)).stoppedEffects).toMatchObject({ checked: 1, settled: 1, effectsNotApplied: 1 });
  expect(await entry(jobId, inFlightKey())).toMatchObject({ state: 'failed', lookups: 1 });
  const job = await readJob(jobId);
  expect(job.cancellation?.effects).toMatchObject({ counts: { applied: 4, planned: 1, failed: 1, unknown: 0, applying: 0 }, settled: true });
  expect(job.effectsToSettleAtMs).toBeNull();
  expect(cancellationReport(job.cancellation!)).toContain('Effects: 4 applied, 2 not applied, 0 unknown (final, checked with the test receiver).');
  await expectLedgerMatchesReceiver(jobId);
});

test('bug 2: after the owner\'s "stop here" the failed job\'s unknown effect is checked again until the receiver answers, then settled', async () => {
  const input = { campaign: 'Renewal', recipients: 3 };
  const jobId = await harness.submit('notify', input, 'owner-1');
  const second = buildPlan(jobId, notifyInput.parse(input)).messages[1]!;
  receiver().inject({ op: 'apply', mode: 'apply-then-hang', times: 1, key: second.sendKey });
  receiver().inject({ op: 'lookup', mode: 'unavailable', times: Number.POSITIVE_INFINITY });
  expect(kinds(await harness.drain())).toEqual(['handed-off', 'waiting']);
  await decideJob(harness.store, harness.queue, { jobId, owner: 'owner-1', questionId: 'unknown-effects-1', answer: UNKNOWN_OPTIONS.stop });
  expect(kinds(await harness.drain())).toEqual(['failed']);
  const stoppedMs = harness.clock.now();
  expect((await readJob(jobId)).effectsToSettleAtMs).not.toBeNull(); // marked when its first effect was sent

  // Found before the grace period is over: its check is moved to the end of it, nothing is asked.
  const lookupsBefore = lookups();
  expect((await sweepAt(stoppedMs)).stoppedEffects).toMatchObject({ deferred: 1, checked: 0 });
  expect((await readJob(jobId)).effectsToSettleAtMs).toBe(stoppedMs + GRACE_MS);
  expect(lookups()).toBe(lookupsBefore);

  // The receiver still cannot answer lookups: still unknown, asked again later.
  expect((await sweepAt(stoppedMs + GRACE_MS)).stoppedEffects).toMatchObject({ checked: 1, settled: 0, pending: 1 });
  const retryAtMs = (await readJob(jobId)).effectsToSettleAtMs ?? 0;
  expect(retryAtMs).toBe(stoppedMs + 2 * GRACE_MS);
  expect((await entry(jobId, second.sendKey)).state).toBe('unknown');

  receiver().clearFaults();
  expect((await sweepAt(retryAtMs - 1)).stoppedEffects.checked).toBe(0);
  expect((await sweepAt(retryAtMs)).stoppedEffects).toMatchObject({ checked: 1, settled: 1, effectsFoundApplied: 1 });
  const job = await readJob(jobId);
  expect(job).toMatchObject({ status: 'failed', effectsToSettleAtMs: null, progress: { unknown: 0, sent: receiver().applied('message').length } });
  expect(await entry(jobId, second.sendKey)).toMatchObject({ state: 'applied', reconciled: true });
  await expectLedgerMatchesReceiver(jobId);
  const events = (await db().collection(`${JOBS}/${jobId}/events`).get()).docs.map((doc) => doc.get('kind') as string);
  expect(events.filter((kind) => kind === 'effects-reconciled')).toHaveLength(2);
});

test('bug 2: a job quarantined while its worker was lost mid-apply has that effect settled by the sweeper', async () => {
  const input = { campaign: 'Renewal', recipients: 2 };
  const jobId = await harness.submit('notify', input, 'owner-1');
  const target = buildPlan(jobId, notifyInput.parse(input)).messages[0]!.sendKey;
  const real = httpAdapter(receiver());
  const freezing: EffectAdapter = {
    name: real.name,
    lookup: (key, signal) => real.lookup(key, signal),
    async apply(intent: EffectIntent, key: string, signal: AbortSignal) {
      await real.apply(intent, key, signal);
      return hangForever(); // applied at the receiver; this worker never writes the ledger
    },
  };
  notify.deps.current = { ...notify.deps.current, adapter: freezing };
  expect(kinds(await harness.drain(1))).toEqual(['handed-off']);
  const [task] = harness.queue.drain();
  void runStep(harness.deps('doomed-worker'), task!.task);
  await eventually(() => receiver().applied().length === 1, 'the frozen apply reached the receiver');
  notify.deps.current = { ...notify.deps.current, adapter: real };

  const expiredMs = harness.clock.now() + (harness.options.leaseSeconds + 1) * 1000;
  const first = await sweepAt(expiredMs);
  expect(first.quarantined).toBe(1);
  expect(first.stoppedEffects).toMatchObject({ deferred: 1, checked: 0 });
  expect((await entry(jobId, target)).state).toBe('applying');

  expect((await sweepAt(expiredMs + GRACE_MS)).stoppedEffects).toMatchObject({ checked: 1, settled: 1, effectsFoundApplied: 1 });
  expect(await entry(jobId, target)).toMatchObject({ state: 'applied', reconciled: true, unknowns: 1 });
  expect(await readJob(jobId)).toMatchObject({ status: 'quarantined', effectsToSettleAtMs: null, progress: { sent: 1, unknown: 0 } });
  expect(receiver().applied()).toHaveLength(1);
  await expectLedgerMatchesReceiver(jobId);
});

test('a sweep without effect adapters wired leaves stopped jobs\' effects alone and reads nothing for them', async () => {
  const hold = gate();
  const { jobId, worker, cancelAtMs } = await cancelWithThirdMessageInFlight(3, hold.promise, 'after-apply');
  hold.open();
  await worker;
  harness.clock.set(cancelAtMs + GRACE_MS);
  const report = await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
  expect(report.stoppedEffects).toMatchObject({ checked: 0, queryPages: 0 });
  expect((await readJob(jobId)).effectsToSettleAtMs).toBe(cancelAtMs + GRACE_MS);
});

test("bug 26: a stopped job's pass waits out an adapter's send deadline longer than its minute before writing an in-flight send off", async () => {
  const SEND_TIMEOUT_MS = 180_000;
  const input = { campaign: 'Renewal', recipients: 1 };
  const jobId = await harness.submit('notify', input, 'owner-1');
  const target = buildPlan(jobId, notifyInput.parse(input)).messages[0]!.sendKey;
  const real = httpAdapter(receiver());
  const held = gate();
  let sending = false;
  // A slow send within the adapter's declared deadline: the request reaches the receiver only when released.
  const slow: EffectAdapter = {
    name: real.name,
    sendTimeoutMs: SEND_TIMEOUT_MS,
    lookup: (key, signal) => real.lookup(key, signal),
    async apply(intent: EffectIntent, key: string) {
      sending = true;
      await held.promise;
      return real.apply(intent, key, new AbortController().signal);
    },
  };
  notify.deps.current = { ...notify.deps.current, adapter: slow };
  expect(kinds(await harness.drain(1))).toEqual(['handed-off']);
  const [task] = harness.queue.drain();
  const sentAtMs = harness.clock.now();
  const worker = runStep(harness.deps('slow-worker'), task!.task);
  await eventually(() => sending, 'the send is on its way');

  // The holder's renewals stall past its lease: quarantined while its send is well inside its deadline.
  const expiredMs = sentAtMs + (harness.options.leaseSeconds + 1) * 1000;
  expect((await sweepAt(expiredMs)).quarantined).toBe(1);
  const minuteLaterMs = expiredMs + GRACE_MS;
  expect(minuteLaterMs).toBeLessThan(sentAtMs + SEND_TIMEOUT_MS);
  await sweepAt(minuteLaterMs);
  expect((await entry(jobId, target)).state).toBe('applying'); // was written off as "not applied" here

  // The request lands inside its deadline; once that is over, the pass finds it applied.
  held.open();
  await worker;
  expect(receiver().applied('message')).toHaveLength(1);
  const report = await sweepAt(sentAtMs + SEND_TIMEOUT_MS + IN_FLIGHT_MARGIN_MS);
  expect(report.stoppedEffects).toMatchObject({ checked: 1, settled: 1, effectsFoundApplied: 1, effectsNotApplied: 0 });
  expect(await entry(jobId, target)).toMatchObject({ state: 'applied', reconciled: true });
  await expectLedgerMatchesReceiver(jobId);
});

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
describe('after a cancel: the settle mark and its checks, on the default lost-worker limit', () => {
  const { harness, notify, receiver } = notifySuite('settle-after-cancel');

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
    notify.deps.current = { ...notify.deps.current, adapter: createHttpEffectAdapter({ baseUrl: receiver().url, timeoutMs: 120_000, name: 'the test receiver' }) };
    let inFlight: string | null = null;
    receiver().afterApply = async (application) => {
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
    receiver().inject({ op: 'lookup', mode: 'unavailable', times: Number.POSITIVE_INFINITY });
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
    receiver().clearFaults();
    expect((await sweepAt(sweeperStore, endMs)).stoppedEffects).toMatchObject({ queryDocuments: 0, checked: 0 });

    // The soak's final pass, dated one grace period (and a second) past the end: 575.8 s after the cancel < 600 s.
    const finals = await soakFinalPasses(sweeperStore, endMs);
    expect(finals).toHaveLength(1); // 0 pending, 0 errors: the hour-ahead pass is skipped
    expect(finals[0]).toMatchObject({ checked: 0, settled: 0, pending: 0, errors: 0, queryDocuments: 0 });
    // What the soak's invariant then reads: a cancelled job whose in-flight effect is still unknown ...
    const stuck = await readJob(jobId);
    expect(stuck).toMatchObject({ status: 'cancelled', effectsToSettleAtMs: cancelAtMs + 600_000, cancellation: { effects: { settled: false } } });
    expect(await entry(jobId, key())).toMatchObject({ state: 'unknown', lastOutcome: 'sending to the test receiver' });
    expect(receiver().requests.filter((request) => request.op === 'lookup')).toHaveLength(3);
    // ... with its check still set, not lost: due 24.2 s after the final pass's "now".
    expect(nextCheckMs - (endMs + GRACE_MS + 1_000)).toBe(24_200);

    // A pass dated past the longest recheck (as the soak's second pass would be) settles it.
    const late = await settleStoppedEffects({ store: sweeperStore, stoppedEffects: { settlerFor: notifyStoppedEffects(() => notify.deps.current) }, log: () => undefined }, endMs + MAX_SETTLE_RECHECK_MS + GRACE_MS + 1_000);
    expect(late).toMatchObject({ checked: 1, settled: 1, pending: 0, effectsFoundApplied: 1 });
    expect(await entry(jobId, key())).toMatchObject({ state: 'applied', reconciled: true });
    expect((await readJob(jobId)).effectsToSettleAtMs).toBeNull();
  });
});
