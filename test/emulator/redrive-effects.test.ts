/**
 * Re-drive and external effects, through the notify pipeline and the local receiver (the system of
 * record) on the official Firestore emulator: the effect ledger is not set aside, so a re-driven
 * job finds every applied effect applied and sends it no more, and an effect a lost worker left
 * `applying` (outcome unknown) is looked up at the receiver before anything is sent: found means
 * applied (never sent again), not found means sent once more under the same key.
 */
import type { JobRecord } from '../../functions/src/core/job';
import { redriveJob, releaseQuarantined } from '../../functions/src/engine/operator';
import { runStep } from '../../functions/src/engine/step';
import { sweep } from '../../functions/src/engine/sweeper';
import { effectEntrySchema, type EffectEntry } from '../../functions/src/effects/ledger';
import { createHttpEffectAdapter } from '../../functions/src/effects/http-adapter';
import { buildPlan, notifyInput, type NotifyPlan, notifyStoppedEffects } from '../../functions/src/pipelines/notify';
import { decodeJob } from '../../functions/src/store/codec';
import { jobPath, JOBS } from '../../functions/src/store/paths';
import { gate } from '../support/engine';
import { applyRequestsFor, eventually, httpAdapter, messagesPerRecipient, notifySuite } from '../support/receiver';
import { DEFAULT_SETTLE_GRACE_MS } from '../../functions/src/effects/after-stop';

// The first expired lease quarantines: a worker lost mid-apply leaves a quarantined job behind.
const { harness, notify, receiver } = notifySuite('redrive-effects', { options: { maxStaleReclaims: 0 } });

const db = () => harness.firestore.db;
const kinds = (outcomes: readonly { kind: string }[]) => outcomes.map((outcome) => outcome.kind);
const readJob = async (jobId: string): Promise<JobRecord> => decodeJob(jobId, (await db().doc(jobPath(jobId)).get()).data());
const entry = async (jobId: string, key: string): Promise<EffectEntry> => effectEntrySchema.parse((await db().doc(`${JOBS}/${jobId}/effects/${key}`).get()).data());
const applyRequests = () => receiver().requests.filter((request) => request.op === 'apply').length;
const redrive = (jobId: string, fromPhase: string) =>
  redriveJob(harness.store, harness.queue, { jobId, fromPhase, by: 'ops-ana', reason: 'the receiver had a bad day' }, harness.clock.now(), { pipelines: notify.registry });

async function submitNotify(recipients: number): Promise<{ jobId: string; plan: NotifyPlan }> {
  const input = { campaign: 'Renewal', recipients };
  const jobId = await harness.submit('notify', input, 'owner-1');
  return { jobId, plan: buildPlan(jobId, notifyInput.parse(input)) };
}

test('a completed notify job re-driven from its plan sends nothing again: every effect is found applied in the ledger', async () => {
  const { jobId, plan } = await submitNotify(3);
  expect(kinds(await harness.drain())).toEqual(['handed-off', 'handed-off', 'completed']);
  expect(applyRequests()).toBe(6);

  const result = await redrive(jobId, 'plan');
  expect(result.setAside).toBe(3); // the plan and send checkpoints, the published answer
  expect((await db().collection(`${JOBS}/${jobId}/effects`).get()).size).toBe(6);

  expect(kinds(await harness.drain())).toEqual(['handed-off', 'handed-off', 'completed']);
  // Planned again, the same keys; the ledger says applied; the receiver got nothing more.
  expect(applyRequests()).toBe(6);
  for (const message of plan.messages) expect(applyRequestsFor(receiver(), message.sendKey)).toBe(1);
  expect([...messagesPerRecipient(receiver()).values()]).toEqual([1, 1, 1]);
  const job = await readJob(jobId);
  expect(job).toMatchObject({ status: 'completed', outcome: 'complete' });
  expect(job.progress).toMatchObject({ total: 3, done: 3, sent: 3, logged: 3, unknown: 0 });
  // One published answer, the re-run's.
  expect((await db().collection(`${JOBS}/${jobId}/results`).get()).size).toBe(1);
});

/**
 * Runs a notify job's send step until its third message is held at the receiver, then loses the
 * worker: the lease expires, and the sweeper quarantines the job (one lost worker is over the limit
 * here) with that effect `applying`, its outcome unknown.
 */
async function quarantinedWithThirdMessageInFlight(where: 'after-apply' | 'before-apply') {
  const { jobId, plan } = await submitNotify(4);
  expect(kinds(await harness.drain(1))).toEqual(['handed-off']); // the plan
  notify.deps.current = { ...notify.deps.current, adapter: createHttpEffectAdapter({ baseUrl: receiver().url, timeoutMs: 120_000, name: 'the test receiver' }) };
  const hold = gate();
  const third = plan.messages[2]!.sendKey;
  if (where === 'after-apply') {
    receiver().afterApply = async (application) => {
      if (application.key === third) await hold.promise; // applied at the receiver; the answer never comes back
    };
  } else {
    receiver().beforeApply = async ({ key }) => {
      if (key === third) await hold.promise;
    };
  }
  const [task] = harness.queue.drain();
  const lost = runStep(harness.deps('lost-worker'), task!.task);
  await eventually(() => receiver().requests.some((request) => request.op === 'apply' && request.key === third), 'the third message reached the receiver');
  expect((await entry(jobId, third)).state).toBe('applying');

  harness.clock.advance((harness.options.leaseSeconds + 1) * 1000);
  await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
  expect(await readJob(jobId)).toMatchObject({ status: 'quarantined' });
  // Held before applying: once released, the receiver fails it without applying (a 500, an unknown outcome).
  if (where === 'before-apply') receiver().inject({ op: 'apply', mode: 'fail-before-apply', times: 1, key: third });
  hold.open();
  expect((await lost).kind).toBe('ownership-lost');
  receiver().afterApply = null;
  receiver().beforeApply = null;
  notify.deps.current = { ...notify.deps.current, adapter: httpAdapter(receiver()) };
  return { jobId, plan, third };
}

test('an effect whose outcome was unknown (applied, its answer lost) is looked up after the re-drive, found, and never sent again', async () => {
  const { jobId, plan, third } = await quarantinedWithThirdMessageInFlight('after-apply');
  expect(applyRequestsFor(receiver(), third)).toBe(1);

  await redrive(jobId, 'send');
  expect(kinds(await harness.drain())).toEqual(['handed-off', 'completed']);

  expect(await entry(jobId, third)).toMatchObject({ state: 'applied', reconciled: true });
  expect(applyRequestsFor(receiver(), third)).toBe(1);
  expect(receiver().requests.some((request) => request.op === 'lookup' && request.key === third)).toBe(true);
  expect(messagesPerRecipient(receiver()).size).toBe(4);
  expect([...messagesPerRecipient(receiver()).values()].every((count) => count === 1)).toBe(true);
  for (const message of plan.messages) expect((await entry(jobId, message.recordKey)).state).toBe('applied');
  expect(await readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
});

test('an effect whose outcome was unknown and that never reached the receiver is looked up, not found, and sent once under the same key', async () => {
  const { jobId, third } = await quarantinedWithThirdMessageInFlight('before-apply');
  expect(receiver().applied('message').some((application) => application.key === third)).toBe(false);

  await redrive(jobId, 'send');
  await harness.drain();

  expect(await entry(jobId, third)).toMatchObject({ state: 'applied', reconciled: false });
  // Looked up first (not there), then sent again under the same key: two requests, one application.
  expect(receiver().requests.filter((request) => request.op === 'lookup' && request.key === third).length).toBeGreaterThanOrEqual(1);
  expect(applyRequestsFor(receiver(), third)).toBe(2);
  expect(receiver().applied('message').filter((application) => application.key === third)).toHaveLength(1);
  expect([...messagesPerRecipient(receiver()).values()].every((count) => count === 1)).toBe(true);
  expect(await readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
});

/**
 * Re-drive, release and effects, with the sweeper wired as deployed (stoppedEffects on); found by
 * hostile reviews. README: "an effect left `applying` or `unknown` is looked up at the system of
 * record before anything is retried (found: applied; not found: sent once more under the same
 * key)". In production the sweeper's stopped-effects pass reaches a quarantined job first (a minute
 * after it stopped), records the unsent message as `failed` ("a stopped job does not retry"), and
 * the re-driven or released job then never sent it.
 */
describe('with the sweeper wired as deployed (its stopped-effects pass on)', () => {
  /** The sweep as the deployed trigger runs it: with the notify pipeline's effect adapter. */
  const deployedSweep = () => sweep({ store: harness.store, queue: harness.queue, log: () => undefined, stoppedEffects: { settlerFor: notifyStoppedEffects(() => notify.deps.current) } }, harness.clock.now());

  /**
   * A notify job whose worker dies inside the send of its third message (held at the receiver, then
   * refused before it applies): the sweeper quarantines the job (no stale reclaim allowed), and a
   * minute later its stopped-effects pass closes the unsent message as not applied. Resolves to the
   * job and the key of that message, with the ledger entry as the pass left it.
   */
  async function quarantinedInsideASend(recipients: number): Promise<{ jobId: string; third: string; settled: EffectEntry }> {
    const input = { campaign: 'Renewal', recipients };
    const jobId = await harness.submit('notify', input, 'owner-1');
    const plan = buildPlan(jobId, notifyInput.parse(input));
    expect(kinds(await harness.drain(1))).toEqual(['handed-off']); // the plan
    notify.deps.current = { ...notify.deps.current, adapter: createHttpEffectAdapter({ baseUrl: receiver().url, timeoutMs: 120_000, name: 'the test receiver' }) };
    const hold = gate();
    const third = plan.messages[2]!.sendKey;
    receiver().beforeApply = async ({ key }) => {
      if (key === third) await hold.promise;
    };
    const [task] = harness.queue.drain();
    const lost = runStep(harness.deps('lost-worker'), task!.task);
    await eventually(() => receiver().requests.some((request) => request.op === 'apply' && request.key === third), 'the third message reached the receiver');
    harness.clock.advance((harness.options.leaseSeconds + 1) * 1000);
    await deployedSweep();
    expect((await readJob(jobId)).status).toBe('quarantined');
    receiver().inject({ op: 'apply', mode: 'fail-before-apply', times: 1, key: third });
    hold.open();
    expect((await lost).kind).toBe('ownership-lost');
    receiver().beforeApply = null;
    notify.deps.current = { ...notify.deps.current, adapter: httpAdapter(receiver()) };
    expect(receiver().applied('message').some((application) => application.key === third)).toBe(false);

    // The sweeper runs every minute: its stopped-effects pass gets to the quarantined job first.
    harness.clock.advance(DEFAULT_SETTLE_GRACE_MS + 1_000);
    await deployedSweep();
    return { jobId, third, settled: await entry(jobId, third) };
  }

  test('a message that never reached the receiver when the job was quarantined is sent once by the re-driven job', async () => {
    const { jobId, third, settled } = await quarantinedInsideASend(4);

    // Then the operator re-drives it from `send`, as the README says to.
    harness.clock.advance(10 * 60_000);
    await redriveJob(harness.store, harness.queue, { jobId, fromPhase: 'send', by: 'ops-ana', reason: 'the receiver had a bad day' }, harness.clock.now(), { pipelines: notify.registry });
    await harness.drain();

    expect({
      ledgerAfterSweep: settled.state,
      ledgerAfterRedrive: (await entry(jobId, third)).state,
      recipientsWithTheMessage: messagesPerRecipient(receiver()).size,
      thirdApplied: receiver().applied('message').filter((application) => application.key === third).length,
      job: (await readJob(jobId)).status,
    }).toEqual({ ledgerAfterSweep: 'failed', ledgerAfterRedrive: 'applied', recipientsWithTheMessage: 4, thirdApplied: 1, job: 'completed' });
  });

  test('bug 25: a message that never reached the receiver when the job was quarantined is sent once by the released job, and every other message exactly once', async () => {
    const { jobId, third, settled } = await quarantinedInsideASend(4);

    // The operator releases it instead (the console's first action for a quarantined job).
    harness.clock.advance(10 * 60_000);
    await releaseQuarantined(harness.store, harness.queue, jobId, harness.clock.now(), () => undefined, 'ops-ana');
    const reopened = await entry(jobId, third);
    await harness.drain();

    const job = await readJob(jobId);
    expect({
      ledgerAfterSweep: settled.state,
      ledgerAfterRelease: reopened.state,
      ledgerAtTheEnd: (await entry(jobId, third)).state,
      messagesPerRecipient: [...messagesPerRecipient(receiver()).values()],
      thirdApplied: receiver().applied('message').filter((application) => application.key === third).length,
      job: { status: job.status, outcome: job.outcome },
    }).toEqual({
      ledgerAfterSweep: 'failed',
      ledgerAfterRelease: 'unknown',
      ledgerAtTheEnd: 'applied',
      messagesPerRecipient: [1, 1, 1, 1],
      thirdApplied: 1,
      job: { status: 'completed', outcome: 'complete' },
    });
  });
});
