/**
 * The effect ledger holds no lock (issue 28, item 2): its moves go through the door as the holder,
 * one commit conditioned on the holder's record and on the entry as read, instead of a transaction
 * that read the job. A holder that dies between deciding a move and sending its commit leaves
 * nothing for the sweeper or the next holder to wait on; an entry moved by someone else between the
 * read and the commit is decided again, never overwritten. And a plan under a key already recorded:
 * the same intent is the entry as it stands, another intent is refused and writes nothing.
 */
import { intentFingerprint } from '../../functions/src/core/effect-keys';
import { EffectIntentConflictError, EffectStateConflictError, effectEntrySchema } from '../../functions/src/core/effect-ledger';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/step';
import { buildPlan, notifyInput, recordIntent, sendIntent } from '../../functions/src/pipelines/notify';
import { sweep } from '../../functions/src/engine/sweeper';
import { firestoreEffectLedger } from '../../functions/src/store/firestore-ledger';
import type { JobStore } from '../../functions/src/store/job-store';
import { effectPath, jobPath } from '../../functions/src/store/paths';
import { dyingInsideItsChange } from '../support/dead-client';
import { gate, engineSuite } from '../support/engine';
import { afterFirstGet } from '../support/interpose';
import { behaviour, testPipeline } from '../support/test-pipeline';
import { ManualTimers } from '../support/timers';

const harness = engineSuite('effect-ledger-locks', pipelineRegistry(testPipeline), { afterEach: () => { jest.restoreAllMocks(); } });

const db = () => harness.firestore.db;
const readJob = (jobId: string) => harness.readJob(jobId);
const readEntry = async (jobId: string, key: string) => effectEntrySchema.parse((await db().doc(effectPath(jobId, key)).get()).data());
const INTENT = { kind: 'email', identity: 'welcome', target: 'mailto:someone@example.com', payload: { subject: 'hello' } };

/** Settles with the promise, or fails once `ms` of real time passed: a commit waiting on a lock would take about a minute. */
function within<T>(ms: number, what: string, promise: Promise<T>): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} waited more than ${ms} ms: something held a lock`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/** A job held by a worker parked in its first phase; the ledger of that claim, through `store`. */
async function heldClaim() {
  const entered = gate();
  behaviour.first = async () => {
    entered.open();
    return new Promise<never>(() => undefined);
  };
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const [task] = harness.queue.drain();
  void runStep(harness.deps('holder', { timers: new ManualTimers() }), task!.task);
  await entered.promise;
  const claim = { jobId, epoch: (await readJob(jobId)).epoch };
  const ledgerThrough = (store: JobStore) =>
    firestoreEffectLedger({ db: db(), jobId, unit: null, epoch: claim.epoch, clock: harness.clock, signal: new AbortController().signal, commit: (decide) => store.apply({ kind: 'job', claim }, decide) });
  return { jobId, ledgerThrough };
}

test('a holder that dies inside its ledger move (decided, commit never sent) holds nothing: the same move by a live client and the sweeper\'s reclaim commit at once', async () => {
  const { jobId, ledgerThrough } = await heldClaim();
  const [planned] = await ledgerThrough(harness.store).plan([INTENT]);
  const dying = dyingInsideItsChange(harness.store);
  void ledgerThrough(dying.store).transition(planned!.key, ['planned'], { state: 'applying', countAttempt: true, lastOutcome: 'sending' });
  await dying.decided;

  const moved = await within(10_000, 'the live move', ledgerThrough(harness.store).transition(planned!.key, ['planned'], { state: 'applying', countAttempt: true, lastOutcome: 'sending' }));
  expect(moved).toMatchObject({ state: 'applying', attempts: 1 });
  expect((await readJob(jobId)).effectsToSettleAtMs).toBe(harness.clock.now());

  harness.clock.advance((harness.options.leaseSeconds + 1) * 1000);
  const swept = await within(10_000, 'the sweep', sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now()));
  expect(swept.reclaimed).toBe(1);
  expect(await readJob(jobId)).toMatchObject({ status: 'queued', lease: null });
  expect(await readEntry(jobId, planned!.key)).toMatchObject({ state: 'applying', attempts: 1 });
});

test('an entry moved by someone else between the ledger\'s read and its commit is decided again: the move is refused and the other\'s state stands', async () => {
  const { jobId, ledgerThrough } = await heldClaim();
  const [planned] = await ledgerThrough(harness.store).plan([INTENT]);
  const path = effectPath(jobId, planned!.key);
  const interposed = afterFirstGet(db(), path, () => db().doc(path).update({ state: 'failed', lastOutcome: 'written off by someone else' }));
  await expect(ledgerThrough(harness.store).transition(planned!.key, ['planned'], { state: 'applying', countAttempt: true, lastOutcome: 'sending' })).rejects.toThrow(EffectStateConflictError);
  expect(interposed.ran()).toBe(true);
  expect(await readEntry(jobId, planned!.key)).toMatchObject({ state: 'failed', attempts: 0, lastOutcome: 'written off by someone else' });
});

test('planning twice keeps the first entry (first write wins), and a plan by a claim that was taken over writes nothing', async () => {
  const { jobId, ledgerThrough } = await heldClaim();
  const [first] = await ledgerThrough(harness.store).plan([INTENT]);
  await ledgerThrough(harness.store).transition(first!.key, ['planned'], { state: 'applying', countAttempt: true, lastOutcome: 'sending' });
  const [again] = await ledgerThrough(harness.store).plan([INTENT]);
  expect(again).toMatchObject({ key: first!.key, state: 'applying' });

  harness.clock.advance((harness.options.leaseSeconds + 1) * 1000);
  expect((await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now())).reclaimed).toBe(1);
  await expect(ledgerThrough(harness.store).plan([{ ...INTENT, identity: 'another' }])).rejects.toThrow(/epoch|claim|not running|queued/i);
  expect((await db().collection(`${jobPath(jobId)}/effects`).get()).size).toBe(1);
});

test('bug 44: a plan whose intent differs from the one recorded under its key is refused and writes nothing; the same intent again is returned as recorded', async () => {
  const { jobId, ledgerThrough } = await heldClaim();
  const ledger = ledgerThrough(harness.store);
  const [first] = await ledger.plan([INTENT]);
  await ledger.transition(first!.key, ['planned'], { state: 'applying', countAttempt: true, lastOutcome: 'sending' });
  const before = await db().doc(effectPath(jobId, first!.key)).get();

  // Same kind and identity (so the same key), another payload; beside it an intent nobody recorded yet.
  const reused = { ...INTENT, payload: { subject: 'goodbye' } };
  const refused: unknown = await ledger.plan([{ ...INTENT, identity: 'not-yet-recorded' }, reused]).catch((error: unknown) => error);
  expect(refused).toBeInstanceOf(EffectIntentConflictError);
  expect((refused as EffectIntentConflictError).conflicts).toEqual([{ recorded: expect.objectContaining({ key: first!.key, state: 'applying' }) as unknown, planned: reused }]);
  expect((refused as Error).message).toContain(`${first!.key} (email "welcome", applying) is already recorded with another intent`);
  // The recorded entry is untouched, and the refused plan's other intent was not written.
  const after = await db().doc(effectPath(jobId, first!.key)).get();
  expect(after.updateTime?.isEqual(before.updateTime!)).toBe(true);
  expect(after.data()).toEqual(before.data());
  expect((await db().collection(`${jobPath(jobId)}/effects`).get()).size).toBe(1);

  // The same intent planned again (a replay) is the recorded entry, as it stands.
  expect(await ledger.plan([INTENT])).toEqual([expect.objectContaining({ key: first!.key, state: 'applying', attempts: 1 })]);
});

test("notify's intents hash the same when its plan is built again: a re-plan after a crash is accepted, and the entries read back keep their fingerprint", async () => {
  const { jobId, ledgerThrough } = await heldClaim();
  const ledger = ledgerThrough(harness.store);
  const intentsOf = () => {
    const input = notifyInput.parse({ campaign: 'Renewal', recipients: 3 });
    const plan = buildPlan(jobId, input);
    return plan.messages.flatMap((message) => [sendIntent(input.campaign, message), recordIntent(input.campaign, message)]);
  };
  const planned = await ledger.plan(intentsOf());
  expect(planned).toHaveLength(6);
  const replanned = await ledger.plan(intentsOf());
  expect(replanned.map((entry) => entry.key)).toEqual(planned.map((entry) => entry.key));
  // Firestore gives map fields back in its own order: the fingerprint does not depend on it.
  const stored = (await db().collection(`${jobPath(jobId)}/effects`).get()).docs.map((doc) => effectEntrySchema.parse(doc.data()));
  expect(stored.every((entry) => intentFingerprint(entry.intent) === entry.intentHash)).toBe(true);
});
