/**
 * The lease-holder moves, without Firestore: claim, take-over, reclaim, give-back and re-dispatch
 * once each for a holder of a kind made up here (so what they do is the move's, not a job's or a
 * unit's), then the job's and the unit's entries for what only they add.
 */
import type { LeaseHolder, UnitRecord } from '../../functions/src/core/job';
import { newQueuedJob, type JobRecord } from '../../functions/src/core/job';
import { claim, giveBack, heldEpoch, nextStep, reclaimExpired, redispatch, takeOver, TransitionRefused, type HolderKind, type HolderTransition } from '../../functions/src/core/lease-holder';
import { resolveEngineOptions, takeoverAgeMs } from '../../functions/src/core/options';
import { claimJob, claimUnit, giveBackJob, giveBackUnit, reclaimExpiredJob, reclaimExpiredUnit, redispatchJob, redispatchUnit, takeOverJob, takeOverUnit } from '../../functions/src/core/transitions';

const NOW = 1_000_000;
const options = resolveEngineOptions();
const LEASE_MS = options.leaseSeconds * 1000;
// A redelivered task takes over after the stale age plus the clock-skew allowance.
const STALE_MS = takeoverAgeMs(options);

/** A holder of no kind the engine has: a name, the claim fields, and a status of its own for its quarantine. */
type Probe = LeaseHolder<'queued' | 'running' | 'poisoned'> & { readonly name: string };

function probe(overrides: Partial<Probe> = {}): Probe {
  return {
    name: 'p1',
    status: 'queued',
    epoch: 4,
    lease: null,
    step: 2,
    dispatch: 1,
    attempts: 1,
    staleReclaims: 0,
    nextRunAtMs: NOW,
    progress: {},
    cost: {},
    lastError: null,
    claimTally: null,
    updatedAtMs: 0,
    ...overrides,
  };
}

const held = (overrides: Partial<Probe> = {}) => probe({ status: 'running', lease: { epoch: 4, worker: 'w-old', expiresAtMs: NOW + LEASE_MS, renewedAtMs: NOW }, ...overrides });

function probeKind(overrides: Partial<HolderKind<Probe>> = {}): HolderKind<Probe> {
  return {
    noun: 'unit',
    announcesClaims: true,
    event: (holder, kind, text) => ({ kind, message: `${holder.name} ${text}` }),
    dispatch: (holder, delayMs = 0) => ({ task: { jobId: holder.name, step: holder.step }, id: `${holder.name}/${holder.step}/${holder.dispatch}`, delayMs }),
    dispatchAfterReclaim: () => 7,
    quarantine: (holder, reason, staleReclaims): HolderTransition<Probe> => ({
      next: { ...holder, status: 'poisoned', lease: null, staleReclaims },
      events: [{ kind: 'quarantined', message: reason }],
      quarantine: reason,
    }),
    ...overrides,
  };
}

const KIND = probeKind();
const input = { step: 2, worker: 'w-new', options };

describe('claim', () => {
  test('queued and due at the task\'s step → running under a new epoch, with a lease that runs from now; the kind decides whether the timeline says so', () => {
    const claimed = claim(KIND, probe(), input, NOW);
    expect(claimed.next).toMatchObject({ status: 'running', epoch: 5, lease: { epoch: 5, worker: 'w-new', expiresAtMs: NOW + LEASE_MS, renewedAtMs: NOW } });
    expect(claimed.events).toEqual([{ kind: 'claimed', message: 'p1 claimed by w-new (epoch 5)' }]);
    expect(claimed.dispatch).toBeUndefined();
    expect(claim(probeKind({ announcesClaims: false }), probe(), input, NOW).events).toEqual([]);
  });

  test('refused when not queued, at another step, or not yet due (saying how long until it is), in the noun of its kind', () => {
    expect(() => claim(KIND, held(), input, NOW)).toThrow(new TransitionRefused('unit is running'));
    expect(() => claim(probeKind({ noun: 'job' }), probe({ step: 3 }), input, NOW)).toThrow(new TransitionRefused('task is for step 2, job is at step 3'));
    let refusal: unknown;
    try {
      claim(KIND, probe({ nextRunAtMs: NOW + 4_000 }), input, NOW);
    } catch (error) {
      refusal = error;
    }
    expect(refusal).toBeInstanceOf(TransitionRefused);
    expect(refusal).toMatchObject({ message: 'unit is backing off', notYetDueMs: 4_000 });
  });
});

describe('take over', () => {
  const silent = held({ lease: { epoch: 4, worker: 'w-old', expiresAtMs: NOW + LEASE_MS, renewedAtMs: NOW - STALE_MS } });

  test('a holder whose heartbeat is stale is taken over under a new epoch, one lost worker counted, the old claim and the new told', () => {
    const taken = takeOver(KIND, silent, input, NOW);
    expect(taken.next).toMatchObject({ status: 'running', epoch: 5, staleReclaims: 1, step: 2, lease: { epoch: 5, worker: 'w-new', expiresAtMs: NOW + LEASE_MS } });
    expect(taken.events.map((event) => event.kind)).toEqual(['reclaimed', 'claimed']);
    expect(taken.events[0]?.message).toMatch(/^p1 reclaimed at step 2: no heartbeat from w-old \(epoch 4\)/);
    expect(taken.quarantine).toBeUndefined();
  });

  test('a fresh heartbeat is refused with the time until it would be stale; no lease, another status or another step is refused', () => {
    let refusal: unknown;
    try {
      takeOver(KIND, held({ lease: { epoch: 4, worker: 'w-old', expiresAtMs: NOW + LEASE_MS, renewedAtMs: NOW - 1_000 } }), input, NOW);
    } catch (error) {
      refusal = error;
    }
    expect(refusal).toMatchObject({ notYetDueMs: STALE_MS - 1_000 });
    expect(() => takeOver(KIND, held({ lease: null }), input, NOW)).toThrow(/unit is running without a lease/);
    expect(() => takeOver(KIND, probe(), input, NOW)).toThrow(/unit is queued at step 2/);
    expect(() => takeOver(KIND, silent, { ...input, step: 3 }, NOW)).toThrow(TransitionRefused);
  });

  test('past the lost-worker limit the kind\'s quarantine decides, with the count and the reason', () => {
    const quarantined = takeOver(KIND, { ...silent, staleReclaims: options.maxStaleReclaims }, input, NOW);
    expect(quarantined.next).toMatchObject({ status: 'poisoned', lease: null, staleReclaims: options.maxStaleReclaims + 1 });
    expect(quarantined.quarantine).toMatch(/its lease expired 4 times/);
  });
});

describe('reclaim an expired lease', () => {
  const expired = held({ lease: { epoch: 4, worker: 'w-old', expiresAtMs: NOW, renewedAtMs: NOW - LEASE_MS } });

  test('requeued at the next step, due now, under the dispatch number its kind gives, with that task; one lost worker counted', () => {
    const reclaimed = reclaimExpired(KIND, expired, options, NOW);
    expect(reclaimed.next).toMatchObject({ status: 'queued', lease: null, step: 3, dispatch: 7, nextRunAtMs: NOW, staleReclaims: 1, epoch: 4 });
    expect(reclaimed.dispatch).toEqual({ task: { jobId: 'p1', step: 3 }, id: 'p1/3/7', delayMs: 0 });
    expect(reclaimed.events).toEqual([{ kind: 'reclaimed', message: expect.stringMatching(/^p1 requeued at step 3: the lease of epoch 4 held by w-old expired at .*\(stale reclaim 1 of at most 3\)$/) as unknown }]);
  });

  test('a lease renewed since the query, a holder no longer running or without a lease is refused; past the limit the kind quarantines', () => {
    expect(() => reclaimExpired(KIND, held(), options, NOW)).toThrow(/the lease was extended since the query/);
    expect(() => reclaimExpired(KIND, probe(), options, NOW)).toThrow(/changed since the query: it is queued without a lease/);
    expect(() => reclaimExpired(KIND, held({ lease: null }), options, NOW)).toThrow(TransitionRefused);
    expect(reclaimExpired(KIND, { ...expired, staleReclaims: options.maxStaleReclaims }, options, NOW).next.status).toBe('poisoned');
  });
});

describe('give back', () => {
  test('a running holder goes back to the queue at its next step (dispatch 0), a lost worker counted, with its task', () => {
    const given = giveBack(KIND, held(), { why: 'no progress', options }, NOW);
    expect(given.next).toMatchObject({ status: 'queued', lease: null, step: 3, dispatch: 0, nextRunAtMs: NOW, staleReclaims: 1 });
    expect(given.dispatch?.id).toBe('p1/3/0');
    expect(given.events[0]?.message).toBe('p1 given back at step 2: no progress (lost worker 1 of at most 3)');
  });

  test('past the limit the kind quarantines, the reason naming what the step saw last; a holder not running is refused', () => {
    const quarantined = giveBack(KIND, held({ staleReclaims: options.maxStaleReclaims }), { why: 'no progress', options }, NOW);
    expect(quarantined.quarantine).toMatch(/ \(last: no progress\)$/);
    expect(() => giveBack(KIND, probe(), { why: 'no progress', options }, NOW)).toThrow(/Cannot give a unit back: the record is queued/);
  });
});

describe('re-dispatch a lost task', () => {
  test('a queued holder overdue since before the grace line: the same step under the next dispatch number, due now', () => {
    const again = redispatch(KIND, probe({ nextRunAtMs: NOW - 300_000 }), { lostBeforeMs: NOW - 120_000 }, NOW);
    expect(again.next).toMatchObject({ status: 'queued', step: 2, dispatch: 2, nextRunAtMs: NOW });
    expect(again.dispatch?.id).toBe('p1/2/2');
    expect(again.events).toEqual([{ kind: 'redispatched', message: expect.stringMatching(/^p1 dispatched again \(dispatch 2\): no task claimed step 2 since /) as unknown }]);
  });

  test('not overdue any more, or not queued: refused', () => {
    expect(() => redispatch(KIND, probe({ nextRunAtMs: NOW }), { lostBeforeMs: NOW - 120_000 }, NOW)).toThrow(/the unit is not overdue any more/);
    expect(() => redispatch(KIND, held({ nextRunAtMs: NOW - 300_000 }), { lostBeforeMs: NOW }, NOW)).toThrow(TransitionRefused);
  });
});

describe('the claim a record says is held', () => {
  test('the lease epoch of a running holder; none when it is not running or runs without a lease', () => {
    expect(heldEpoch(held({ lease: { epoch: 9, worker: 'w', expiresAtMs: NOW } }))).toBe(9);
    expect(heldEpoch(held({ lease: null }))).toBeNull();
    expect(heldEpoch(probe({ lease: { epoch: 9, worker: 'w', expiresAtMs: NOW } }))).toBeNull();
  });

  test('the next step: no lease, step + 1, dispatch 0, due when asked', () => {
    expect(nextStep(held(), NOW + 5)).toMatchObject({ lease: null, step: 3, dispatch: 0, nextRunAtMs: NOW + 5, status: 'running' });
  });
});

// ---- What the job's and the unit's entries add ---------------------------------------------------

function job(overrides: Partial<JobRecord> = {}): JobRecord {
  const request = { id: 'job-1', owner: 'user-1', pipeline: 'p', input: {}, conversationId: null, idempotencyKey: null };
  return { ...newQueuedJob(request, 0), phase: 'experts', epoch: 3, step: 2, dispatch: 1, nextRunAtMs: NOW - 300_000, ...overrides };
}

const expiredLease = { epoch: 3, worker: 'w-old', expiresAtMs: NOW, renewedAtMs: NOW - LEASE_MS };
const fanOutJob = job({ status: 'running', lease: null, fanout: { phase: 'experts', epoch: 3, units: 2, done: 0, unitIds: ['u1', 'u2'] } });

function unit(overrides: Partial<UnitRecord> = {}): UnitRecord {
  return { ...probe(), jobId: 'job-1', unit: 'u1', phase: 'experts', fanoutEpoch: 3, status: 'queued', costInJob: {}, result: null, ...overrides };
}

describe('the job entries', () => {
  test("a claim is told in the job's timeline; the tasks are the job's step tasks; a reclaim starts the next step at dispatch 0", () => {
    expect(claimJob(job({ nextRunAtMs: NOW }), input, NOW).events).toEqual([{ kind: 'claimed', message: 'Claimed by w-new (epoch 4)' }]);
    const reclaimed = reclaimExpiredJob(job({ status: 'running', lease: expiredLease }), options, NOW);
    expect(reclaimed.dispatch).toEqual({ task: { jobId: 'job-1', step: 3 }, id: 'job-1-s3-d0', delayMs: 0 });
    expect(reclaimed.events[0]?.message).toMatch(/^Requeued at step 3: the lease of epoch 3/);
    expect(redispatchJob(job(), { lostBeforeMs: NOW - 120_000 }, NOW).dispatch?.id).toBe('job-1-s2-d2');
  });

  test('past the lost-worker limit the job itself is quarantined, no lease and no fan-out left, the reason on record', () => {
    const running = job({ status: 'running', staleReclaims: options.maxStaleReclaims, lease: expiredLease, fanout: { phase: 'experts', epoch: 2, units: 1, done: 0 } });
    for (const transition of [
      reclaimExpiredJob(running, options, NOW),
      giveBackJob(running, { why: 'stalled', options }, NOW),
      takeOverJob(running, input, NOW),
    ]) {
      expect(transition.next).toMatchObject({ status: 'quarantined', lease: null, fanout: null, staleReclaims: options.maxStaleReclaims + 1, quarantine: { atMs: NOW }, finishedAtMs: NOW });
      expect(transition.events).toEqual([{ kind: 'quarantined', message: `Quarantined: ${transition.next.quarantine?.reason ?? ''}` }]);
      expect(transition.dispatch).toBeUndefined();
    }
  });
});

describe('the unit entries', () => {
  test("a claim or take-over needs the unit's fan-out to be its job's current one, checked before anything about the unit", () => {
    const stale = unit({ status: 'running', lease: { epoch: 4, worker: 'w-old', expiresAtMs: NOW, renewedAtMs: NOW - LEASE_MS } });
    expect(claimUnit(fanOutJob, unit(), input, NOW).next).toMatchObject({ status: 'running', epoch: 5 });
    for (const outside of [job({ status: 'running', lease: null }), { ...fanOutJob, epoch: 4 }, { ...fanOutJob, status: 'failed' as const }]) {
      expect(() => claimUnit(outside, unit(), input, NOW)).toThrow(/not in this unit's fan-out/);
      expect(() => takeOverUnit(outside, stale, input, NOW)).toThrow(/not in this unit's fan-out/);
    }
    expect(() => claimUnit(fanOutJob, unit({ fanoutEpoch: 2 }), input, NOW)).toThrow(/not in this unit's fan-out/);
  });

  test("a unit's claim is not told; its events name the unit; its tasks are unit tasks; a reclaim takes a dispatch number never used in the fan-out", () => {
    expect(claimUnit(fanOutJob, unit(), input, NOW).events).toEqual([]);
    const reclaimed = reclaimExpiredUnit(unit({ status: 'running', lease: expiredLease }), options, NOW);
    expect(reclaimed.next).toMatchObject({ step: 3, dispatch: 2 });
    expect(reclaimed.dispatch).toEqual({ task: { jobId: 'job-1', step: 3, unit: 'u1', phase: 'experts' }, id: 'job-1-e3-uu1-s3-d2', delayMs: 0 });
    expect(reclaimed.events).toEqual([{ kind: 'reclaimed', message: expect.stringMatching(/^Unit u1 requeued at step 3/) as unknown, unit: 'u1' }]);
    expect(redispatchUnit(unit({ nextRunAtMs: NOW - 300_000 }), { lostBeforeMs: NOW - 120_000 }, NOW).events[0]).toMatchObject({ unit: 'u1' });
  });

  test('past the lost-worker limit the unit lets go of its lease and names the quarantine its job is to take; the unit itself stays running', () => {
    const tired = unit({ status: 'running', staleReclaims: options.maxStaleReclaims, lease: expiredLease });
    for (const transition of [reclaimExpiredUnit(tired, options, NOW), giveBackUnit(tired, { why: 'stalled', options }, NOW), takeOverUnit(fanOutJob, tired, input, NOW)]) {
      expect(transition.next).toMatchObject({ status: 'running', lease: null, staleReclaims: options.maxStaleReclaims + 1 });
      expect(transition.quarantine).toMatch(/^unit u1: its lease expired 4 times/);
      expect(transition.events).toEqual([{ kind: 'quarantined', message: `Quarantined: ${transition.quarantine ?? ''}`, unit: 'u1' }]);
      expect(transition.dispatch).toBeUndefined();
    }
  });
});
