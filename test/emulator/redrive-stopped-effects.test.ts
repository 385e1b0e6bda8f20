/**
 * Re-drive, release and effects, with the sweeper wired as deployed (stoppedEffects on); found by
 * hostile reviews. README: "an effect left `applying` or `unknown` is looked up at the system of
 * record before anything is retried (found: applied; not found: sent once more under the same
 * key)". In production the sweeper's stopped-effects pass reaches a quarantined job first (a minute
 * after it stopped), records the unsent message as `failed` ("a stopped job does not retry"), and
 * the re-driven or released job then never sent it.
 */
import type { JobRecord } from '../../functions/src/core/job';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { DEFAULT_SETTLE_GRACE_MS } from '../../functions/src/effects/after-stop';
import { createHttpEffectAdapter } from '../../functions/src/effects/http-adapter';
import { effectEntrySchema, type EffectEntry } from '../../functions/src/effects/ledger';
import { redriveJob, releaseQuarantined } from '../../functions/src/engine/operator';
import { runStep } from '../../functions/src/engine/step';
import { sweep } from '../../functions/src/engine/sweeper';
import { buildPlan, notifyInput, notifyStoppedEffects } from '../../functions/src/pipelines/notify';
import { decodeJob } from '../../functions/src/store/codec';
import { jobPath, JOBS } from '../../functions/src/store/paths';
import { engineSuite, gate } from '../support/engine';
import { eventually, httpAdapter, messagesPerRecipient, notifySetup, startReceiver, type Receiver } from '../support/receiver';

let receiver: Receiver;
const notify = notifySetup(() => receiver);

const harness = engineSuite('redrive-stopped-effects', pipelineRegistry(...([...notify.registry.values()] as [never])), {
  options: { maxStaleReclaims: 0 },
  beforeEach: async () => {
    receiver = await startReceiver(harness.clock);
    notify.deps.current = { adapter: httpAdapter(receiver), unavailableWaitMs: 60_000 };
  },
  afterEach: () => receiver.stop(),
});

const db = () => harness.firestore.db;
const kinds = (outcomes: readonly { kind: string }[]) => outcomes.map((outcome) => outcome.kind);
const readJob = async (jobId: string): Promise<JobRecord> => decodeJob(jobId, (await db().doc(jobPath(jobId)).get()).data());
const entry = async (jobId: string, key: string): Promise<EffectEntry> => effectEntrySchema.parse((await db().doc(`${JOBS}/${jobId}/effects/${key}`).get()).data());
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
  notify.deps.current = { ...notify.deps.current, adapter: createHttpEffectAdapter({ baseUrl: receiver.url, timeoutMs: 120_000, name: 'the test receiver' }) };
  const hold = gate();
  const third = plan.messages[2]!.sendKey;
  receiver.beforeApply = async ({ key }) => {
    if (key === third) await hold.promise;
  };
  const [task] = harness.queue.drain();
  const lost = runStep(harness.deps('lost-worker'), task!.task);
  await eventually(() => receiver.requests.some((request) => request.op === 'apply' && request.key === third), 'the third message reached the receiver');
  harness.clock.advance((harness.options.leaseSeconds + 1) * 1000);
  await deployedSweep();
  expect((await readJob(jobId)).status).toBe('quarantined');
  receiver.inject({ op: 'apply', mode: 'fail-before-apply', times: 1, key: third });
  hold.open();
  expect((await lost).kind).toBe('ownership-lost');
  receiver.beforeApply = null;
  notify.deps.current = { ...notify.deps.current, adapter: httpAdapter(receiver) };
  expect(receiver.applied('message').some((application) => application.key === third)).toBe(false);

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
    recipientsWithTheMessage: messagesPerRecipient(receiver).size,
    thirdApplied: receiver.applied('message').filter((application) => application.key === third).length,
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
    messagesPerRecipient: [...messagesPerRecipient(receiver).values()],
    thirdApplied: receiver.applied('message').filter((application) => application.key === third).length,
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
