/**
 * The effect ledger holds no lock (issue 28, item 2): its moves go through the door as the holder,
 * one commit conditioned on the holder's record and on the entry as read, instead of a transaction
 * that read the job. A holder that dies between deciding a move and sending its commit leaves
 * nothing for the sweeper or the next holder to wait on; an entry moved by someone else between the
 * read and the commit is decided again, never overwritten.
 */
import { EffectStateConflictError, effectEntrySchema } from '../../functions/src/core/effect-ledger';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/step';
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
