/**
 * The moves a fan-out unit makes on its job (core/fan-out-moves.ts), the claim checks
 * (core/claims.ts) and the ending of an unreadable job, without Firestore: each move returns both
 * records, goes only where its table entry says, and charges the job every unit's uncounted cost.
 */
import { heldJobEpoch, heldUnitEpoch, holdsClaim, holdsUnitClaim, jobClaimRefusal, unitClaimRefusal } from '../../functions/src/core/claims';
import {
  chargeFanOut,
  failViaUnit,
  FAN_OUT_MOVES,
  finishUnit,
  holdJoinForReruns,
  joinViaUnit,
  quarantineViaUnit,
  setAsideUnit,
  startUnit,
  waitViaUnit,
} from '../../functions/src/core/fan-out-moves';
import { newQueuedJob, type JobRecord, type UnitRecord } from '../../functions/src/core/job';
import { budgetWait } from '../../functions/src/core/lifecycle';
import { TransitionRefused } from '../../functions/src/core/transitions';
import { endUnreadableJobStatus } from '../../functions/src/core/unreadable-job';
import { unitRecord } from '../support/records';

const NOW = 1_000_000;
const lease = (epoch: number) => ({ epoch, worker: 'w', expiresAtMs: NOW + 60_000, renewedAtMs: NOW });

function job(overrides: Partial<JobRecord> = {}): JobRecord {
  const request = { id: 'job-1', owner: 'user-1', pipeline: 'p', input: {}, conversationId: null, idempotencyKey: null };
  return {
    ...newQueuedJob(request, 0),
    status: 'running',
    phase: 'experts',
    epoch: 3,
    step: 2,
    cost: { usd: 1 },
    fanout: { phase: 'experts', epoch: 3, units: 3, done: 0, unitIds: ['u1', 'u2', 'u3'] },
    ...overrides,
  };
}

function unit(name: string, overrides: Partial<UnitRecord> = {}): UnitRecord {
  return unitRecord({ jobId: 'job-1', unit: name, phase: 'experts', fanoutEpoch: 3, status: 'running', epoch: 5, lease: lease(5), nextRunAtMs: NOW, ...overrides });
}

/** The mover has spent 2 (none counted); a sibling 3 of which 1 is counted; another phase's unit 10 (never charged here). */
const mover = unit('u1', { cost: { usd: 2 } });
const others = [mover, unit('u2', { cost: { usd: 3 }, costInJob: { usd: 1 } }), unit('u3', { status: 'done', cost: { usd: 0.5 }, costInJob: { usd: 0.5 } }), unit('u2', { phase: 'other', cost: { usd: 10 } })];

const statusesAllowed = (rule: { readonly from: readonly string[]; readonly to: readonly string[] } | null, before: string, after: string) =>
  rule === null || (rule.from.includes(before) && rule.to.includes(after));

describe('a unit ending its job’s fan-out', () => {
  test('fail via a unit: the job fails with the error, the unit is left queued with its last error, every uncounted cost reaches the job once', () => {
    const lastError = { code: 'terminal', message: 'boom', atMs: NOW };
    const moved = failViaUnit(job(), mover, others, { reason: 'unit u1: boom', error: { code: 'terminal', message: 'u1: boom', retryable: false, atMs: NOW }, lastError }, NOW);
    expect(moved.job).toMatchObject({ status: 'failed', fanout: null, lease: null, lastError: { message: 'u1: boom' } });
    expect(moved.unit).toMatchObject({ status: 'queued', lease: null, lastError, costInJob: { usd: 2 } });
    // 1 (the job's) + 2 (the mover's) + 2 (u2's uncounted part); u3 was counted, the other phase's unit is not this fan-out's.
    expect(moved.job.cost.usd).toBe(5);
    expect(moved.charged.map((charged) => [charged.phase, charged.unit, charged.costInJob])).toEqual([['experts', 'u2', { usd: 3 }]]);
    expect(statusesAllowed(FAN_OUT_MOVES.failViaUnit.job, 'running', moved.job.status)).toBe(true);
    expect(statusesAllowed(FAN_OUT_MOVES.failViaUnit.unit, 'running', moved.unit.status)).toBe(true);
  });

  test('wait via a unit: the job waits, the unit goes back to the queue and tells why; the fan-out’s cost is charged', () => {
    const waiting = budgetWait({ message: 'cap reached', resetAtMs: NOW + 1_000 });
    const moved = waitViaUnit(job(), mover, others, { wait: waiting, message: 'u1: cap reached' }, NOW);
    expect(moved.job).toMatchObject({ status: 'waiting', fanout: null });
    expect(moved.unit).toMatchObject({ status: 'queued', lease: null });
    expect(moved.events).toEqual([{ kind: 'waiting', message: 'u1: cap reached' }]);
    expect(moved.job.cost.usd).toBe(5);
    expect(statusesAllowed(FAN_OUT_MOVES.waitViaUnit.job, 'running', moved.job.status)).toBe(true);
  });

  test('quarantine via a unit: the unit’s own transition is kept (its events first), the job is quarantined and charged', () => {
    const transition = { next: { ...mover, lease: null, staleReclaims: 4 }, events: [{ kind: 'quarantined', message: 'Quarantined: unit u1: lost', unit: 'u1' }], quarantine: 'unit u1: lost' };
    const moved = quarantineViaUnit(job(), transition, others, NOW);
    expect(moved.job).toMatchObject({ status: 'quarantined', fanout: null, quarantine: { reason: 'unit u1: lost' } });
    expect(moved.unit).toMatchObject({ staleReclaims: 4, lease: null });
    expect(moved.events[0]).toEqual(transition.events[0]);
    expect(moved.job.cost.usd).toBe(5);
  });

  test('a job not running refuses every move through its unit', () => {
    const stopped = job({ status: 'cancelled', fanout: null });
    expect(() => failViaUnit(stopped, mover, [], { reason: 'r', error: { code: 'c', message: 'm', retryable: false, atMs: NOW }, lastError: null }, NOW)).toThrow(TransitionRefused);
    expect(() => waitViaUnit(stopped, mover, [], { wait: budgetWait({ message: 'm', resetAtMs: NOW }), message: 'm' }, NOW)).toThrow(TransitionRefused);
    expect(() => finishUnit(stopped, mover, { result: 1, resultVersion: 1 })).toThrow(TransitionRefused);
  });

  test('chargeFanOut: no fan-out charges nothing; the unit named `except` and other phases are left out', () => {
    expect(chargeFanOut(job(), null, others)).toEqual({ job: job(), charged: [] });
    const charged = chargeFanOut(job(), job().fanout, others, 'u1');
    expect(charged.job.cost.usd).toBe(3);
    expect(charged.charged.map((entry) => entry.unit)).toEqual(['u2']);
  });
});

describe('finish and join', () => {
  test('a unit that is not the last out is counted done with its result and cost; the join is not due', () => {
    const finished = finishUnit(job(), mover, { result: { value: 1 }, resultVersion: 2 });
    expect(finished.last).toBe(false);
    expect(finished.job).toMatchObject({ status: 'running', fanout: { done: 1 }, cost: { usd: 3 } });
    expect(finished.unit).toMatchObject({ status: 'done', lease: null, result: { value: 1 }, resultVersion: 2, costInJob: { usd: 2 } });
    expect(finished.events).toEqual([{ kind: 'unit-done', message: 'u1 finished' }]);
    expect(() => joinViaUnit(finished, { nextPhase: 'write', message: 'joined' }, NOW)).toThrow(TransitionRefused);
  });

  test('the last unit out joins: the job goes on to its next phase; reruns hold the join back by their number', () => {
    const last = finishUnit(job({ fanout: { phase: 'experts', epoch: 3, units: 3, done: 2, unitIds: ['u1', 'u2', 'u3'] } }), mover, { result: 1, resultVersion: 1 });
    expect(last.last).toBe(true);
    expect(holdJoinForReruns(last, 1).fanout).toMatchObject({ done: 2 });
    const joined = joinViaUnit(last, { nextPhase: 'write', message: 'experts: all 3 units finished' }, NOW);
    expect(joined.next).toMatchObject({ status: 'queued', phase: 'write', fanout: null });
    expect(statusesAllowed(FAN_OUT_MOVES.finishAndJoin.job, 'running', joined.next.status)).toBe(true);
  });

  test('a unit of a fan-out the job has left cannot finish in it', () => {
    expect(() => finishUnit(job({ fanout: { phase: 'experts', epoch: 4, units: 3, done: 0 } }), mover, { result: 1, resultVersion: 1 })).toThrow(/no longer in fan-out epoch 3/);
  });
});

describe('a fan-out’s unit records', () => {
  test('startUnit: a reused result is done at this version; a new or re-run unit is queued at its next step, its spending kept', () => {
    const earlier = unit('u1', { status: 'done', step: 4, epoch: 7, staleReclaims: 1, cost: { usd: 2 }, costInJob: { usd: 2 }, result: { old: true } });
    const reused = startUnit(earlier, { jobId: 'job-1', phase: 'experts', unit: 'u1', fanoutEpoch: 9, reused: { value: { migrated: true } }, resultVersion: 3 }, NOW);
    expect(reused).toMatchObject({ status: 'done', fanoutEpoch: 9, step: 5, epoch: 7, result: { migrated: true }, resultVersion: 3, cost: { usd: 2 }, costInJob: { usd: 2 }, lease: null });
    const rerun = startUnit(earlier, { jobId: 'job-1', phase: 'experts', unit: 'u1', fanoutEpoch: 9, reused: null, resultVersion: 3 }, NOW);
    expect(rerun).toMatchObject({ status: 'queued', result: null, staleReclaims: 1, step: 5 });
    expect(rerun).not.toHaveProperty('resultVersion');
    expect(startUnit(null, { jobId: 'job-1', phase: 'experts', unit: 'u9', fanoutEpoch: 9, reused: null, resultVersion: 1 }, NOW)).toMatchObject({ status: 'queued', step: 0, epoch: 0, cost: {} });
  });

  test('setAsideUnit: no result, no lease, fresh budgets, and why', () => {
    const aside = setAsideUnit(unit('u1', { status: 'done', attempts: 2, staleReclaims: 3, result: 1 }), { message: 'set aside by r1', atMs: NOW });
    expect(aside).toMatchObject({ status: 'running', lease: null, result: null, attempts: 0, staleReclaims: 0, lastError: { code: 'set-aside', message: 'set aside by r1', atMs: NOW } });
    expect(FAN_OUT_MOVES.setAside.unit.to).toContain(aside.status);
  });
});

describe('claims', () => {
  test('a job claim holds only while the job runs under its epoch and lease', () => {
    const held = job({ fanout: null, lease: lease(3) });
    expect(holdsClaim(held, { jobId: 'job-1', epoch: 3 })).toBe(true);
    expect(jobClaimRefusal(held, { jobId: 'job-1', epoch: 3 })).toBeNull();
    expect(holdsClaim({ ...held, lease: lease(4) }, { jobId: 'job-1', epoch: 3 })).toBe(false);
    expect(jobClaimRefusal({ ...held, status: 'queued' }, { jobId: 'job-1', epoch: 3 })).toMatch(/no longer owns job job-1 \(status queued, epoch 3\)/);
    expect(heldJobEpoch(held)).toBe(3);
    expect(heldJobEpoch({ status: 'queued', lease: lease(3) })).toBeNull();
  });

  test('a unit claim holds only while its job is in its fan-out and the unit runs under its epoch; a revoked slot refuses it too', () => {
    const claim = { jobId: 'job-1', phase: 'experts', unit: 'u1', epoch: 5, fanoutEpoch: 3 };
    expect(holdsUnitClaim(job(), mover, claim)).toBe(true);
    expect(unitClaimRefusal(job(), mover, claim)).toBeNull();
    expect(unitClaimRefusal(job(), mover, claim, true)).toMatch(/claim slot revoked/);
    expect(holdsUnitClaim(job({ epoch: 4 }), mover, claim)).toBe(false);
    expect(holdsUnitClaim(job(), { ...mover, epoch: 6, lease: lease(6) }, claim)).toBe(false);
    expect(heldUnitEpoch(mover)).toBe(5);
    expect(heldUnitEpoch({ status: 'done', lease: null })).toBeNull();
  });
});

describe('an unreadable job', () => {
  test('is quarantined where it stands unless it had ended (or is quarantined already)', () => {
    expect(endUnreadableJobStatus('running')).toEqual({ ended: false, quarantine: true, status: 'quarantined' });
    expect(endUnreadableJobStatus(42)).toEqual({ ended: false, quarantine: true, status: 'quarantined' });
    expect(endUnreadableJobStatus('quarantined')).toEqual({ ended: false, quarantine: false, status: 'quarantined' });
    expect(endUnreadableJobStatus('completed')).toEqual({ ended: true, quarantine: false, status: 'completed' });
  });
});
