/**
 * The lifecycle table, without Firestore: every transition from each status it allows, every
 * refusal, task IDs only from the table, and the architecture page's diagram against the table.
 */
import { budgetWait } from '../../functions/src/core/lifecycle';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { JOB_STATUSES, newQueuedJob, type JobRecord, type JobStatus, type UnitRecord } from '../../functions/src/core/job';
import { resolveEngineOptions, takeoverAgeMs } from '../../functions/src/core/options';
import {
  allowedJobMove,
  cancelJobRecord,
  chargeUnits,
  claimJob,
  claimUnit,
  completeJob,
  currentFanOut,
  decideWaitingJob,
  failJobForUnit,
  firstDisallowedMove,
  giveBackJob,
  giveBackUnit,
  handOffJob,
  JOB_TRANSITIONS,
  jobMoves,
  joinJob,
  parkUnit,
  quarantineJobForUnit,
  reclaimExpiredJob,
  reclaimExpiredUnit,
  redispatchJob,
  redispatchUnit,
  releaseJob,
  requeueUnit,
  rerunUnit,
  resumeWaitJob,
  settleJobError,
  startFanOutJob,
  takeOverJob,
  takeOverUnit,
  TransitionRefused,
  waitJob,
  yieldUnit,
} from '../../functions/src/core/transitions';
import { unitRecord } from '../support/records';

const NOW = 1_000_000;
const options = resolveEngineOptions();
const input = { step: 2, worker: 'w-new', options };

function job(overrides: Partial<JobRecord> = {}): JobRecord {
  const request = { id: 'job-1', owner: 'user-1', pipeline: 'p', input: {}, conversationId: null, idempotencyKey: null };
  return { ...newQueuedJob(request, 0), phase: 'draft', epoch: 3, step: 2, dispatch: 1, attempts: 1, staleReclaims: 1, nextRunAtMs: NOW, eventSeq: 4, ...overrides };
}

const running = (overrides: Partial<JobRecord> = {}) => job({ status: 'running', lease: { epoch: 3, worker: 'w-old', expiresAtMs: NOW + 60_000, renewedAtMs: NOW - 1_000 }, ...overrides });

function unit(overrides: Partial<UnitRecord> = {}): UnitRecord {
  return unitRecord({ jobId: 'job-1', unit: 'u1', phase: 'experts', fanoutEpoch: 3, epoch: 5, step: 2, nextRunAtMs: NOW, ...overrides });
}

const inFanOut = running({ lease: null, fanout: { phase: 'experts', epoch: 3, units: 2, done: 0 } });

/** Every status but the ones given, to test refusals exhaustively. */
const otherThan = (...allowed: JobStatus[]) => JOB_STATUSES.filter((status) => !allowed.includes(status));

describe('job transitions', () => {
  test('claim: queued → running with a new epoch and a fresh lease; refused from every other status', () => {
    const claimed = claimJob(job(), input, NOW);
    expect(claimed.next).toMatchObject({ status: 'running', epoch: 4, lease: { epoch: 4, worker: 'w-new', expiresAtMs: NOW + options.leaseSeconds * 1000, renewedAtMs: NOW } });
    expect(claimed.events.map((event) => event.kind)).toEqual(['claimed']);
    expect(claimed.dispatch).toBeUndefined();
    for (const status of otherThan('queued')) expect(() => claimJob(job({ status }), input, NOW)).toThrow(TransitionRefused);
  });

  test('claim: a task for another step or a job backing off is refused; backing off says for how long', () => {
    expect(() => claimJob(job(), { ...input, step: 1 }, NOW)).toThrow(/task is for step 1/);
    try {
      claimJob(job({ nextRunAtMs: NOW + 5_000 }), input, NOW);
      throw new Error('not refused');
    } catch (error) {
      expect(error).toBeInstanceOf(TransitionRefused);
      expect((error as TransitionRefused).notYetDueMs).toBe(5_000);
    }
  });

  test('take over: a stale heartbeat gives a new epoch and counts a lost worker; a fresh one asks for a later redelivery', () => {
    const stale = running({ lease: { epoch: 3, worker: 'w-old', expiresAtMs: NOW + 60_000, renewedAtMs: NOW - takeoverAgeMs(options) } });
    const taken = takeOverJob(stale, input, NOW);
    expect(taken.next).toMatchObject({ status: 'running', epoch: 4, staleReclaims: 2, lease: { epoch: 4, worker: 'w-new' } });
    expect(taken.events.map((event) => event.kind)).toEqual(['reclaimed', 'claimed']);
    try {
      takeOverJob(running(), input, NOW);
      throw new Error('not refused');
    } catch (error) {
      expect((error as TransitionRefused).notYetDueMs).toBe(takeoverAgeMs(options) - 1_000);
    }
  });

  test('take over: past the lost-worker limit the job is quarantined; without a lease (a fan-out) or at another step it is refused', () => {
    const stale = running({ staleReclaims: options.maxStaleReclaims, lease: { epoch: 3, worker: 'w', expiresAtMs: NOW - 1, renewedAtMs: NOW - 999_999 } });
    expect(takeOverJob(stale, input, NOW).next).toMatchObject({ status: 'quarantined', lease: null, staleReclaims: options.maxStaleReclaims + 1 });
    expect(() => takeOverJob(inFanOut, input, NOW)).toThrow(/without a lease/);
    expect(() => takeOverJob(running({ step: 7 }), input, NOW)).toThrow(TransitionRefused);
    for (const status of otherThan('running')) expect(() => takeOverJob(job({ status }), input, NOW)).toThrow(TransitionRefused);
  });

  test('hand-off: running → queued at the next step with its task; a checkpoint resets both budgets', () => {
    const plain = handOffJob(running(), { checkpointed: false, nextPhase: 'draft' }, NOW);
    expect(plain.next).toMatchObject({ status: 'queued', step: 3, dispatch: 0, lease: null, attempts: 1, staleReclaims: 1, nextRunAtMs: NOW });
    expect(plain.dispatch).toEqual({ task: { jobId: 'job-1', step: 3 }, id: 'job-1-s3-d0', delayMs: 0 });
    expect(handOffJob(running(), { checkpointed: true, nextPhase: 'review' }, NOW).next).toMatchObject({ attempts: 0, staleReclaims: 0, phase: 'review' });
    for (const status of otherThan('running')) expect(() => handOffJob(job({ status }), { checkpointed: true, nextPhase: 'x' }, NOW)).toThrow(TransitionRefused);
  });

  test('wait: a decision waits with no due time a sweep acts on; a provider wait is due at its resume time', () => {
    const decision = waitJob(running(), { reason: 'decision', questionId: 'q', question: 'Go?', options: ['yes'], untilMs: null }, NOW);
    expect(decision.next).toMatchObject({ status: 'waiting', step: 3, lease: null, waiting: { reason: 'decision', untilMs: null } });
    const provider = waitJob(running(), { reason: 'provider', questionId: 'provider', question: 'down', options: [], untilMs: NOW + 900_000 }, NOW);
    expect(provider.next.nextRunAtMs).toBe(NOW + 900_000);
    expect(() => waitJob(job(), { reason: 'decision', questionId: 'q', question: 'Go?', options: ['yes'], untilMs: null }, NOW)).toThrow(TransitionRefused);
  });

  test('settle an error: requeue with the backoff as the task delay, wait out a capped outage, or fail', () => {
    const error = { code: 'rate_limited', message: '429', retryable: true, atMs: NOW };
    const requeued = settleJobError(running(), { decision: { action: 'requeue', attempts: 2, nextRunAtMs: NOW + 7_000 }, error }, NOW);
    expect(requeued.next).toMatchObject({ status: 'queued', attempts: 2, step: 3, nextRunAtMs: NOW + 7_000, lastError: error });
    expect(requeued.dispatch).toEqual({ task: { jobId: 'job-1', step: 3 }, id: 'job-1-s3-d0', delayMs: 7_000 });
    const waiting = settleJobError(running(), { decision: { action: 'wait', attempts: 2, untilMs: NOW + 900_000, reason: 'capped' }, error }, NOW);
    expect(waiting.next).toMatchObject({ status: 'waiting', waiting: { reason: 'provider', untilMs: NOW + 900_000 } });
    expect(waiting.dispatch).toBeUndefined();
    const failed = settleJobError(running(), { decision: { action: 'fail', attempts: 5, reason: 'budget spent' }, error }, NOW);
    expect(failed.next).toMatchObject({ status: 'failed', finishedAtMs: NOW, lease: null });
    expect(() => settleJobError(job(), { decision: { action: 'fail', attempts: 1, reason: 'x' }, error }, NOW)).toThrow(TransitionRefused);
  });

  test('complete: running → completed, naming what is missing from a partial result', () => {
    const completed = completeJob(running(), { outcome: 'partial', missing: ['section 3'] }, NOW);
    expect(completed.next).toMatchObject({ status: 'completed', outcome: 'partial', lease: null, finishedAtMs: NOW });
    expect(completed.events[0]?.message).toContain('missing: section 3');
    for (const status of otherThan('running')) expect(() => completeJob(job({ status }), { outcome: 'complete', missing: [] }, NOW)).toThrow(TransitionRefused);
  });

  test('fan-out start: units hold the leases; with nothing to run it joins in the same transition', () => {
    const fanout = { phase: 'experts', epoch: 3, units: 2, done: 0 };
    const started = startFanOutJob(running(), { fanout, joinedNextPhase: null }, NOW);
    expect(started.next).toMatchObject({ status: 'running', lease: null, fanout });
    expect(started.dispatch).toBeUndefined();
    const joined = startFanOutJob(running(), { fanout: { ...fanout, units: 0 }, joinedNextPhase: 'write' }, NOW);
    expect(joined.next).toMatchObject({ status: 'queued', fanout: null, phase: 'write', step: 3 });
    expect(joined.events.map((event) => event.kind)).toEqual(['fanned-out', 'joined']);
    expect(joined.dispatch?.id).toBe('job-1-s3-d0');
  });

  test('join: the fan-out ends, budgets reset, the next step is dispatched', () => {
    const joined = joinJob(inFanOut, { nextPhase: 'write', message: 'all done' }, NOW);
    expect(joined.next).toMatchObject({ status: 'queued', fanout: null, attempts: 0, staleReclaims: 0, phase: 'write', step: 3 });
    expect(joined.dispatch?.id).toBe('job-1-s3-d0');
  });

  test('reclaim an expired lease: requeue at the next step, or quarantine past the limit; a live lease is refused', () => {
    const expired = running({ lease: { epoch: 3, worker: 'w', expiresAtMs: NOW } });
    expect(reclaimExpiredJob(expired, options, NOW).next).toMatchObject({ status: 'queued', staleReclaims: 2, step: 3 });
    expect(reclaimExpiredJob(expired, options, NOW).dispatch?.id).toBe('job-1-s3-d0');
    expect(reclaimExpiredJob({ ...expired, staleReclaims: options.maxStaleReclaims }, options, NOW).next.status).toBe('quarantined');
    expect(() => reclaimExpiredJob(running(), options, NOW)).toThrow(/extended/);
    expect(() => reclaimExpiredJob(inFanOut, options, NOW)).toThrow(TransitionRefused);
  });

  test('give back a stalled job: requeue (a lost worker) or quarantine past the limit', () => {
    expect(giveBackJob(running(), { why: 'no progress', options }, NOW).next).toMatchObject({ status: 'queued', staleReclaims: 2 });
    expect(giveBackJob(running({ staleReclaims: options.maxStaleReclaims }), { why: 'no progress', options }, NOW).next.status).toBe('quarantined');
    expect(() => giveBackJob(job(), { why: 'x', options }, NOW)).toThrow(TransitionRefused);
  });

  test('re-dispatch a lost task: the same step under a new dispatch number, only once overdue', () => {
    const redone = redispatchJob(job({ nextRunAtMs: NOW - 200_000 }), { lostBeforeMs: NOW - 120_000 }, NOW);
    expect(redone.next).toMatchObject({ status: 'queued', step: 2, dispatch: 2, nextRunAtMs: NOW });
    expect(redone.dispatch?.id).toBe('job-1-s2-d2');
    expect(() => redispatchJob(job({ nextRunAtMs: NOW }), { lostBeforeMs: NOW - 120_000 }, NOW)).toThrow(/not overdue/);
    expect(() => redispatchJob(running(), { lostBeforeMs: NOW }, NOW)).toThrow(TransitionRefused);
  });

  test('resume a provider wait when due; a decision wait never resumes by itself', () => {
    const waiting = job({ status: 'waiting', waiting: { reason: 'provider', questionId: 'provider', question: 'down', options: [], untilMs: NOW } });
    expect(resumeWaitJob(waiting, NOW).next).toMatchObject({ status: 'queued', waiting: null, step: 3 });
    expect(() => resumeWaitJob({ ...waiting, waiting: { ...waiting.waiting!, untilMs: NOW + 1 } }, NOW)).toThrow(/extended/);
    expect(() => resumeWaitJob(job({ status: 'waiting', waiting: { reason: 'decision', questionId: 'q', question: 'Go?', options: ['y'], untilMs: null } }), NOW)).toThrow(/waits for a person/);
  });

  test('decide: the answer is filed under its question and the job is dispatched; another question is refused', () => {
    const waiting = job({ status: 'waiting', waiting: { reason: 'decision', questionId: 'q1', question: 'Go?', options: ['yes', 'no'], untilMs: null } });
    const decided = decideWaitingJob(waiting, { questionId: 'q1', answer: 'yes' }, NOW);
    expect(decided.next).toMatchObject({ status: 'queued', waiting: null, decisions: { q1: 'yes' }, step: 3 });
    expect(decided.dispatch?.id).toBe('job-1-s3-d0');
    expect(() => decideWaitingJob(waiting, { questionId: 'q2', answer: 'yes' }, NOW)).toThrow(/waiting on question q1/);
    expect(() => decideWaitingJob(running(), { questionId: 'q1', answer: 'yes' }, NOW)).toThrow(/not waiting for a decision/);
  });

  test('a budget wait: resumed by itself when the day ends, or by its owner with "resume" (nothing filed as a decision); other answers refused', () => {
    const atLimit = job({ status: 'waiting', decisions: { depth: 'short' }, waiting: budgetWait({ message: 'Limit reached.', resetAtMs: NOW }) });
    expect(atLimit.waiting).toMatchObject({ reason: 'budget', questionId: 'budget', options: ['resume', 'cancel'], untilMs: NOW });
    const resumed = resumeWaitJob(atLimit, NOW);
    expect(resumed.next).toMatchObject({ status: 'queued', waiting: null, step: 3 });
    expect(resumed.events[0]?.message).toMatch(/^The daily spend limit reset at/);
    expect(() => resumeWaitJob(atLimit, NOW - 1)).toThrow(/extended/);

    const answered = decideWaitingJob(atLimit, { questionId: 'budget', answer: 'resume' }, NOW - 1_000);
    expect(answered.next).toMatchObject({ status: 'queued', waiting: null, step: 3, decisions: { depth: 'short' } });
    expect(answered.dispatch?.id).toBe('job-1-s3-d0');
    expect(() => decideWaitingJob(atLimit, { questionId: 'budget', answer: 'cancel' }, NOW)).toThrow(/resumed with "resume"/);
    expect(() => decideWaitingJob(atLimit, { questionId: 'depth', answer: 'resume' }, NOW)).toThrow(/waiting on question budget/);
    // A provider wait is nobody's to answer.
    expect(() => decideWaitingJob(job({ status: 'waiting', waiting: { reason: 'provider', questionId: 'provider', question: 'down', options: [], untilMs: NOW } }), { questionId: 'provider', answer: 'resume' }, NOW)).toThrow(/not waiting for a decision/);
  });

  test('cancel: from queued, running or waiting; a finished job is refused', () => {
    const cancellation = { atMs: NOW, reason: 'stop', by: null, phase: null, sectionsDone: null, effects: null };
    for (const status of ['queued', 'running', 'waiting'] as const) {
      expect(cancelJobRecord(job({ status }), { cancellation, message: 'Cancelled', effectsToSettleAtMs: null }, NOW).next).toMatchObject({ status: 'cancelled', lease: null, fanout: null });
    }
    for (const status of ['completed', 'failed', 'cancelled', 'quarantined'] as const) {
      expect(() => cancelJobRecord(job({ status }), { cancellation, message: 'x', effectsToSettleAtMs: null }, NOW)).toThrow(TransitionRefused);
    }
  });

  test('release: a quarantined job goes back with fresh budgets at a new step; anything else is refused', () => {
    const released = releaseJob(job({ status: 'quarantined', quarantine: { reason: 'poison', atMs: 0 }, finishedAtMs: 5 }), NOW);
    expect(released.next).toMatchObject({ status: 'queued', quarantine: null, attempts: 0, staleReclaims: 0, step: 3, finishedAtMs: null });
    expect(released.dispatch?.id).toBe('job-1-s3-d0');
    expect(released.events[0]?.message).toMatch(/^Released from quarantine by an operator \(it was quarantined because poison\)/);
    expect(releaseJob(job({ status: 'quarantined', quarantine: null }), NOW, 'ops-ana').events[0]?.message).toMatch(/^Released from quarantine by operator ops-ana;/);
    for (const status of otherThan('quarantined')) expect(() => releaseJob(job({ status }), NOW)).toThrow(TransitionRefused);
  });

  test('retention: completing, failing and cancelling make the stamping due at the end time; nothing else does', () => {
    const due = { dueAtMs: NOW, cursor: null };
    const error = { code: 'bad', message: 'no', retryable: false, atMs: NOW };
    const cancellation = { atMs: NOW, reason: 'stop', by: null, phase: null, sectionsDone: null, effects: null };
    expect(completeJob(running(), { outcome: 'complete', missing: [] }, NOW).next.retention).toEqual(due);
    expect(settleJobError(running(), { decision: { action: 'fail', attempts: 5, reason: 'spent' }, error }, NOW).next.retention).toEqual(due);
    for (const status of ['queued', 'running', 'waiting'] as const) {
      expect(cancelJobRecord(job({ status }), { cancellation, message: 'Cancelled', effectsToSettleAtMs: null }, NOW).next.retention).toEqual(due);
    }
    // A quarantined or waiting job has not ended (an operator may release it; a person may answer it).
    const expired = running({ lease: { epoch: 3, worker: 'w', expiresAtMs: NOW }, staleReclaims: options.maxStaleReclaims });
    const notEnded = [
      reclaimExpiredJob(expired, options, NOW).next,
      giveBackJob(running({ staleReclaims: options.maxStaleReclaims }), { why: 'stuck', options }, NOW).next,
      takeOverJob(running({ staleReclaims: options.maxStaleReclaims, lease: { epoch: 3, worker: 'w', expiresAtMs: NOW - 1 } }), input, NOW).next,
      waitJob(running(), { reason: 'decision', questionId: 'q', question: 'Go?', options: ['yes'], untilMs: null }, NOW).next,
      settleJobError(running(), { decision: { action: 'wait', attempts: 2, untilMs: NOW + 900_000, reason: 'capped' }, error: { ...error, retryable: true } }, NOW).next,
      handOffJob(running(), { checkpointed: true, nextPhase: 'x' }, NOW).next,
      releaseJob(job({ status: 'quarantined' }), NOW).next,
    ];
    expect(notEnded.map((record) => record.status)).toEqual(['quarantined', 'quarantined', 'quarantined', 'waiting', 'waiting', 'queued', 'queued']);
    for (const record of notEnded) expect(record.retention ?? null).toBeNull();
    expect(newQueuedJob({ id: 'j', owner: 'o', pipeline: 'p', input: {}, conversationId: null, idempotencyKey: null }, NOW).retention).toBeNull();
  });

  test('every job transition lands only on statuses its table entry names', () => {
    const landed: [string, JobStatus, JobStatus][] = [
      ['claim', 'queued', claimJob(job(), input, NOW).next.status],
      ['handOff', 'running', handOffJob(running(), { checkpointed: true, nextPhase: 'x' }, NOW).next.status],
      ['complete', 'running', completeJob(running(), { outcome: 'complete', missing: [] }, NOW).next.status],
      ['release', 'quarantined', releaseJob(job({ status: 'quarantined' }), NOW).next.status],
    ];
    for (const [name, from, to] of landed) {
      const entry = JOB_TRANSITIONS[name as keyof typeof JOB_TRANSITIONS] as { from: readonly string[]; to: readonly string[] };
      expect(entry.from).toContain(from);
      expect(entry.to).toContain(to);
      expect(allowedJobMove(from, to)).toBe(true);
    }
    expect(allowedJobMove('completed', 'running')).toBe(false);
    expect(allowedJobMove('queued', 'completed')).toBe(false);
  });
});

describe('unit transitions', () => {
  test('claim: a queued unit of the current fan-out, under its own epoch; otherwise refused', () => {
    expect(claimUnit(inFanOut, unit(), input, NOW).next).toMatchObject({ status: 'running', epoch: 6, lease: { epoch: 6 } });
    expect(() => claimUnit(running(), unit(), input, NOW)).toThrow(/not in this unit's fan-out/);
    expect(() => claimUnit(inFanOut, unit({ status: 'done' }), input, NOW)).toThrow(/unit is done/);
    expect(() => claimUnit(inFanOut, unit({ step: 1 }), input, NOW)).toThrow(/task is for step 2, unit is at step 1/);
    expect(() => claimUnit(inFanOut, unit({ nextRunAtMs: NOW + 10 }), input, NOW)).toThrow(/backing off/);
  });

  test('take over a unit: stale heartbeat → new epoch; past the limit it names the quarantine for the job', () => {
    const stale = unit({ status: 'running', lease: { epoch: 5, worker: 'w', expiresAtMs: NOW + 1, renewedAtMs: NOW - 31_000 } });
    expect(takeOverUnit(inFanOut, stale, input, NOW).next).toMatchObject({ epoch: 6, staleReclaims: 1 });
    expect(takeOverUnit(inFanOut, { ...stale, staleReclaims: options.maxStaleReclaims }, input, NOW).quarantine).toMatch(/unit u1/);
    expect(() => takeOverUnit(inFanOut, unit({ status: 'running', lease: { epoch: 5, worker: 'w', expiresAtMs: NOW + 1, renewedAtMs: NOW } }), input, NOW)).toThrow(TransitionRefused);
  });

  test('yield, requeue, give back, reclaim, re-dispatch, park: each moves the unit on with the right task', () => {
    const runningUnit = unit({ status: 'running', epoch: 6, lease: { epoch: 6, worker: 'w', expiresAtMs: NOW } });
    const yielded = yieldUnit(runningUnit, NOW);
    expect(yielded.next).toMatchObject({ status: 'queued', step: 3, lease: null });
    expect(yielded.dispatch).toEqual({ task: { jobId: 'job-1', step: 3, unit: 'u1', phase: 'experts' }, id: 'job-1-e3-uu1-s3-d0', delayMs: 0 });
    const requeued = requeueUnit(runningUnit, { attempts: 1, untilMs: NOW + 4_000, message: 'retry', kind: 'retrying', lastError: null }, NOW);
    expect(requeued.dispatch?.delayMs).toBe(4_000);
    expect(giveBackUnit(runningUnit, { why: 'stalled', options }, NOW).next).toMatchObject({ status: 'queued', staleReclaims: 1 });
    const reclaimed = reclaimExpiredUnit(runningUnit, options, NOW);
    expect(reclaimed.next).toMatchObject({ status: 'queued', step: 3, dispatch: 1 });
    expect(reclaimed.dispatch?.id).toBe('job-1-e3-uu1-s3-d1');
    expect(() => reclaimExpiredUnit(unit({ status: 'running', lease: { epoch: 6, worker: 'w', expiresAtMs: NOW + 1 } }), options, NOW)).toThrow(/extended/);
    expect(redispatchUnit(unit({ nextRunAtMs: NOW - 500_000 }), { lostBeforeMs: NOW - 120_000 }, NOW).next.dispatch).toBe(1);
    expect(() => redispatchUnit(runningUnit, { lostBeforeMs: NOW }, NOW)).toThrow(TransitionRefused);
    expect(parkUnit(unit(), { why: 'its job is failed' }, NOW).next).toMatchObject({ status: 'running', lease: null, lastError: { code: 'parked' } });
    expect(() => yieldUnit(unit(), NOW)).toThrow(TransitionRefused);
  });
});

describe('a fan-out ends with the claim that started it', () => {
  const leftOver = { phase: 'experts', epoch: 3, units: 2, done: 0, unitIds: ['u1', 'u2'] };

  test('bug 20: every quarantine ends the fan-out with the job (a unit\'s, a takeover, an expired lease, a give-back), and a release clears one left on record', () => {
    const overBudget = { staleReclaims: options.maxStaleReclaims, fanout: leftOver };
    const quarantined = [
      quarantineJobForUnit(inFanOut, { reason: 'unit u1: its lease expired 4 times' }, NOW).next,
      takeOverJob(running({ ...overBudget, lease: { epoch: 3, worker: 'w', expiresAtMs: NOW - 1, renewedAtMs: NOW - 999_999 } }), input, NOW).next,
      reclaimExpiredJob(running({ ...overBudget, lease: { epoch: 3, worker: 'w', expiresAtMs: NOW } }), options, NOW).next,
      giveBackJob(running(overBudget), { why: 'stuck', options }, NOW).next,
    ];
    expect(quarantined.map((record) => ({ status: record.status, fanout: record.fanout, lease: record.lease }))).toEqual(Array.from({ length: 4 }, () => ({ status: 'quarantined', fanout: null, lease: null })));
    expect(quarantined[0]?.quarantine).toEqual({ reason: 'unit u1: its lease expired 4 times', atMs: NOW });
    expect(releaseJob(job({ status: 'quarantined', fanout: leftOver }), NOW).next).toMatchObject({ status: 'queued', fanout: null });
    expect(() => quarantineJobForUnit(job(), { reason: 'x' }, NOW)).toThrow(TransitionRefused);
  });

  test('bug 20: a fan-out still on record under a later claim of its job is over: its units can neither claim nor take over', () => {
    expect(currentFanOut(inFanOut)).toEqual(inFanOut.fanout);
    // The job claimed again (a release's claim) with the old fan-out still on record.
    const claimedAgain = running({ epoch: 4, lease: { epoch: 4, worker: 'w-release', expiresAtMs: NOW + 60_000, renewedAtMs: NOW }, fanout: leftOver });
    expect(currentFanOut(claimedAgain)).toBeNull();
    expect(() => claimUnit(claimedAgain, unit(), input, NOW)).toThrow(/not in this unit's fan-out/);
    const stale = unit({ status: 'running', lease: { epoch: 5, worker: 'w', expiresAtMs: NOW + 1, renewedAtMs: NOW - 31_000 } });
    expect(() => takeOverUnit(claimedAgain, stale, input, NOW)).toThrow(/not in this unit's fan-out/);
  });

  test('bug 23: the commit that ends a fan-out charges every unit\'s uncounted cost once, and marks it counted', () => {
    const units = [unit({ unit: 'u1', cost: { usd: 1 }, costInJob: {} }), unit({ unit: 'u2', cost: { usd: 1.5 }, costInJob: { usd: 1 } }), unit({ unit: 'u3', cost: { usd: 1 }, costInJob: { usd: 1 } })];
    const first = chargeUnits(running({ cost: { usd: 2 } }), units);
    expect(first.job.cost).toEqual({ usd: 3.5 });
    expect(first.charged.map((charged) => [charged.unit, charged.costInJob])).toEqual([
      ['u1', { usd: 1 }],
      ['u2', { usd: 1.5 }],
    ]);
    // Charged again (the commit decided again, a later release): nothing more.
    const again = chargeUnits(first.job, [...first.charged, units[2] as UnitRecord]);
    expect({ cost: again.job.cost, charged: again.charged }).toEqual({ cost: { usd: 3.5 }, charged: [] });
    const failed = failJobForUnit(inFanOut, { reason: 'unit u1: terminal', error: { code: 'terminal', message: 'u1: boom', retryable: false, atMs: NOW } }, NOW).next;
    expect(failed).toMatchObject({ status: 'failed', fanout: null, lease: null, finishedAtMs: NOW, retention: { dueAtMs: NOW } });
  });

  test('bug 21: a finished unit whose result the join cannot read runs again at its next step, its result and version gone', () => {
    const finished = unit({ status: 'done', step: 4, attempts: 2, result: { value: 1 }, resultVersion: 1 });
    const rerun = rerunUnit(finished, { why: 'produced by version 1' }, NOW);
    expect(rerun.next).toMatchObject({ status: 'queued', step: 5, dispatch: 0, attempts: 0, result: null, lease: null });
    expect(rerun.next).not.toHaveProperty('resultVersion');
    expect(rerun.dispatch?.id).toBe('job-1-e3-uu1-s5-d0');
    expect(() => rerunUnit(unit(), { why: 'x' }, NOW)).toThrow(TransitionRefused);
  });
});

describe('timelines', () => {
  test('a timeline of allowed moves passes; a jump the table does not allow is named', () => {
    expect(firstDisallowedMove(['queued', 'running', 'running', 'queued', 'running', 'waiting', 'queued', 'running', 'completed', 'completed'])).toBeNull();
    expect(firstDisallowedMove(['queued', 'running', 'completed', 'running'])).toEqual({ index: 3, from: 'completed', to: 'running' });
    expect(firstDisallowedMove(['queued', 'completed'])).toEqual({ index: 1, from: 'queued', to: 'completed' });
  });
});

describe("the architecture page's lifecycle diagram is the table", () => {
  test('the moves listed between the lifecycle markers are exactly the moves the table allows', () => {
    const readme = readFileSync(join(__dirname, '..', '..', 'docs', 'architecture.md'), 'utf8');
    const block = /<!-- lifecycle:start -->([\s\S]*?)<!-- lifecycle:end -->/.exec(readme)?.[1];
    expect(block).toBeDefined();
    const listed = new Set([...(block ?? '').matchAll(/^(\w+)\s+->\s+(\w+)/gm)].map((match) => `${match[1]} -> ${match[2]}`));
    expect([...listed].sort()).toEqual([...jobMoves()].sort());
  });
});
