/**
 * The soak's recovery figures over hand-made timelines: which commit counts as the hit job's next
 * durable progress after a fault, and the percentiles over them.
 */
import type { CollectedJob, EventDoc, SectionDoc, TranscriptDoc } from '../../scripts/chaos/model';
import { figures, formatRecovery, percentile, progressAfter, recoveryByKind, waitedBetween, type FaultRecord, type FaultTarget } from '../../scripts/chaos/recovery';

/** Times in these timelines are milliseconds; documents carry microseconds, as Firestore's commit times. */
const us = (ms: number): number => ms * 1000;

const event = (id: string, kind: string, epoch: number, atMs: number): EventDoc => ({ id, kind, epoch, unit: null, commitUs: us(atMs), status: null });
const transcript = (id: string, epoch: number, atMs: number, unit: string | null = null, phase = 'outline'): TranscriptDoc => ({
  id,
  phase,
  unit,
  sectionId: id,
  epoch,
  commitUs: us(atMs),
  generation: 0,
  wastedModelCalls: 0,
  modelCalls: 1,
  toolResultIds: [],
});
const section = (id: string, epoch: number, atMs: number, unit: string, phase: string): SectionDoc => ({ id, phase, unit, sectionId: id, epoch, commitUs: us(atMs) });
/** A unit event written under the unit's own claim, in the engine's ID format (its unit epoch in the ID). */
const unitEvent = (kind: string, phase: string, unit: string, unitEpoch: number, atMs: number, jobEpoch = 2): EventDoc => ({
  id: `u-${String(atMs).padStart(14, '0')}-${phase}~${unit}-${String(unitEpoch).padStart(4, '0')}-0123456789ab-0`,
  kind,
  epoch: jobEpoch,
  unit,
  commitUs: us(atMs),
  status: null,
});

function job(id: string, parts: Partial<Pick<CollectedJob, 'events' | 'sections' | 'transcripts'>>): CollectedJob {
  return {
    id,
    job: {
      status: 'running',
      outcome: null,
      pipeline: 'research',
      idempotencyKey: null,
      owner: 'user-1',
      epoch: 1,
      staleReclaims: 0,
      attempts: 0,
      waiting: null,
      lastError: null,
      quarantine: null,
      cancellation: null,
      cost: {},
      decisions: {},
    },
    events: parts.events ?? [],
    sections: parts.sections ?? [],
    checkpoints: [],
    transcripts: parts.transcripts ?? [],
    effects: [],
    results: [],
    record: null,
    recordProblem: null,
    units: [],
    unitProblems: [],
    unitCosts: [],
    stamped: [],
  };
}

const claim = (jobId: string, epoch: number, unit: string | null = null): FaultTarget => ({ jobId, unit, epoch });

describe('chaos recovery: the next durable progress after a fault', () => {
  // Epoch 1 saves at 1 000 and 2 000; a worker killed at 2 500; the sweeper reclaims at 10 000 and epoch 2
  // claims at 10 200, saves at 11 000; epoch 1's woken zombie never lands anything.
  const killed = job('job-k', {
    events: [event('e1', 'claimed', 1, 500), event('e2', 'reclaimed', 1, 10_000), event('e3', 'claimed', 2, 10_200), event('e4', 'completed', 2, 12_000)],
    transcripts: [transcript('t1', 1, 1_000), transcript('t2', 1, 2_000), transcript('t3', 2, 11_000)],
  });

  test('a hit claim recovers at the first work of a later claim: not its claim, not the reclaim, not its own earlier saves', () => {
    expect(progressAfter(killed, claim('job-k', 1), 2_500)?.what).toBe('transcripts/t3');
    // The same timeline, hit before its own last save: that save is the hit claim's, not a recovery.
    expect(progressAfter(killed, claim('job-k', 1), 1_500)?.what).toBe('transcripts/t3');
  });

  test('a recovery by another claim is split at the take-over: the reclaim 7.5 s after the kill, the new claim\'s first save 1 s later', () => {
    const [row] = recoveryByKind([{ index: 1, kind: 'worker-kill', atMs: 2_500, targets: [claim('job-k', 1)] }], [killed], ['worker-kill']).map(figures);
    expect(row).toMatchObject({ worstMs: 8_500, takenOver: 1, detectP50Ms: 7_500, detectP99Ms: 7_500, resumeP50Ms: 1_000, resumeP99Ms: 1_000 });
    expect(formatRecovery(row ? [row] : []).at(-1)).toMatch(/^ {2}worker-kill +1 +7\.5 +7\.5 +1\.0 +1\.0$/);
  });

  test('a hit claim that no later claim replaced (its owner renewed the expired lease first) recovers at its own next work', () => {
    const renewed = job('job-r', { events: [event('e1', 'claimed', 3, 0)], transcripts: [transcript('t1', 3, 1_000), transcript('t2', 3, 4_000)] });
    expect(progressAfter(renewed, claim('job-r', 3), 2_000)?.what).toBe('transcripts/t2');
  });

  test("the job's end counts, whoever wrote it, and a job hit as a job (not a claim) recovers at its next work by any claim", () => {
    const cancelled = job('job-c', { events: [event('e1', 'claimed', 1, 0), event('e2', 'cancelled', 1, 7_000)], transcripts: [transcript('t1', 1, 1_000)] });
    expect(progressAfter(cancelled, claim('job-c', 1), 2_000)?.what).toBe('events/e2 (cancelled)');
    expect(progressAfter(killed, { jobId: 'job-k', unit: null, epoch: null }, 1_500)?.what).toBe('transcripts/t2');
  });

  test("a unit's claim recovers at its own scope's later claim: other units' work and the job's events do not count", () => {
    const fanned = job('job-u', {
      events: [
        event('e1', 'claimed', 2, 0),
        event('e2', 'fanned-out', 2, 100),
        unitEvent('claimed', 'experts', 'a', 1, 200),
        unitEvent('claimed', 'experts', 'b', 1, 200),
        unitEvent('reclaimed', 'experts', 'a', 1, 9_000),
        unitEvent('claimed', 'experts', 'a', 2, 9_500),
      ],
      transcripts: [transcript('ta1', 1, 1_000, 'a', 'experts'), transcript('tb1', 1, 3_000, 'b', 'experts'), transcript('ta2', 2, 10_000, 'a', 'experts')],
      sections: [section('sb', 1, 4_000, 'b', 'experts'), section('sa', 2, 11_000, 'a', 'experts')],
    });
    expect(progressAfter(fanned, claim('job-u', 1, 'experts~a'), 2_000)?.what).toBe('transcripts/ta2');
    // Hit as a job, the other unit's save is the first progress.
    expect(progressAfter(fanned, { jobId: 'job-u', unit: null, epoch: null }, 2_000)?.what).toBe('transcripts/tb1');
  });

  test("a claim whose worker lived on recovers at its own next work, though the job got a later claim long after; a stopped worker's own commit in flight does not count", () => {
    // Epoch 3's commit answer is lost at 2 000; it checks, goes on, asks a person at 5 000; epoch 4 claims once the person answered (600 000).
    const answered = job('job-a', {
      events: [event('e1', 'claimed', 3, 0), event('e2', 'waiting', 3, 5_000), event('e3', 'claimed', 4, 600_000)],
      transcripts: [transcript('t1', 3, 1_000), transcript('t2', 4, 601_000)],
    });
    expect(progressAfter(answered, claim('job-a', 3), 2_000, false)?.what).toBe('events/e2 (waiting)');
    const [row] = recoveryByKind([{ index: 1, kind: 'commit-answer-lost', atMs: 2_000, targets: [claim('job-a', 3)] }], [answered], ['commit-answer-lost']).map(figures);
    expect(row).toMatchObject({ worstMs: 3_000, takenOver: 0 });
    // Killed at 2 500, its save in flight lands at 2 600, before the reclaim: a leftover, not a recovery.
    const leftover = job('job-l', {
      events: [event('e1', 'claimed', 1, 0), event('e2', 'reclaimed', 1, 10_000), event('e3', 'claimed', 2, 10_200)],
      transcripts: [transcript('t1', 1, 2_600), transcript('t2', 2, 11_000)],
    });
    expect(progressAfter(leftover, claim('job-l', 1), 2_500, true)?.what).toBe('transcripts/t2');
    expect(recoveryByKind([{ index: 2, kind: 'worker-kill', atMs: 2_500, targets: [claim('job-l', 1)] }], [leftover], ['worker-kill']).map(figures)[0]?.worstMs).toBe(8_500);
    // The same timeline after a fault whose worker lived: its own save before the reclaim is its progress.
    expect(progressAfter(leftover, claim('job-l', 1), 2_500, false)?.what).toBe('transcripts/t1');
  });

  test("a reclaimed unit recovers when a later claim finishes it, though that claim wrote nothing else in the unit's scope", () => {
    const unitDone: EventDoc = { ...event('e4', 'unit-done', 5, 8_500), unit: 'a' };
    const reclaimed: EventDoc = { ...event('e3', 'reclaimed', 5, 8_100), unit: 'a' };
    const finished = job('job-f', {
      events: [event('e1', 'claimed', 5, 0), unitEvent('claimed', 'experts', 'a', 1, 100, 5), reclaimed, unitDone, event('e5', 'completed', 6, 90_000)],
      transcripts: [transcript('ta1', 1, 1_000, 'a', 'experts')],
    });
    expect(progressAfter(finished, claim('job-f', 1, 'experts~a'), 2_000)?.what).toBe('events/e4 (unit-done)');
    // Not reclaimed: the unit's finish may be the hit claim's own commit in flight, and the job's end is what counts.
    const notReclaimed = job('job-g', { events: [event('e1', 'claimed', 5, 0), unitEvent('claimed', 'experts', 'a', 1, 100, 5), { ...unitDone, id: 'e2' }, event('e5', 'completed', 6, 90_000)] });
    expect(progressAfter(notReclaimed, claim('job-g', 1, 'experts~a'), 2_000, true)?.what).toBe('events/e5 (completed)');
  });

  test("an expired lease the fault's own sweep reclaimed: the live holder's commit landing before that reclaim is a leftover, not the recovery", () => {
    // The lease moved into the past at 0; the holder's save lands at 62, the fault's sweep reclaims at 107 (answering at 300), the next claim saves at 240.
    const swept = job('job-le', {
      events: [event('e1', 'claimed', 2, -400), event('e2', 'reclaimed', 2, 107), event('e3', 'claimed', 3, 150)],
      transcripts: [transcript('t5', 2, 62), transcript('t6', 3, 240)],
    });
    const expiry = (stopsHolderByMs: number | undefined, target: FaultTarget): FaultRecord[] => [
      { index: 1, kind: 'lease-expiry', atMs: 0, targets: [target], ...(stopsHolderByMs === undefined ? {} : { stopsHolderByMs }) },
    ];
    expect(recoveryByKind(expiry(300, claim('job-le', 2)), [swept], ['lease-expiry']).map(figures)[0]?.worstMs).toBe(240);
    // A reclaim after the fault's sweep had answered is not its doing (the holder renewed first, and lost its lease later): its own save counts.
    expect(recoveryByKind(expiry(100, claim('job-le', 2)), [swept], ['lease-expiry']).map(figures)[0]?.worstMs).toBe(62);
    expect(recoveryByKind(expiry(undefined, claim('job-le', 2)), [swept], ['lease-expiry']).map(figures)[0]?.worstMs).toBe(62);
    // A unit's reclaim is an event under the unit's own claim, its unit epoch in the ID: it stops the hit claim as the job's reclaim does.
    const sweptUnit = job('job-lu', {
      events: [event('e1', 'claimed', 5, -5_000), unitEvent('reclaimed', 'experts', 'e1', 2, 275, 5)],
      transcripts: [transcript('ta3', 2, 16, 'e1', 'experts'), transcript('ta4', 3, 11_242, 'e1', 'experts')],
    });
    expect(recoveryByKind(expiry(400, claim('job-lu', 2, 'experts~e1')), [sweptUnit], ['lease-expiry']).map(figures)[0]?.worstMs).toBe(11_242);
    // The same event supersedes the claim for any fault: a commit of that claim after its reclaim never counts.
    const lateLeftover = job('job-lv', {
      events: [event('e1', 'claimed', 5, -5_000), unitEvent('reclaimed', 'experts', 'e1', 2, 275, 5)],
      transcripts: [transcript('ta3', 2, 300, 'e1', 'experts'), transcript('ta4', 3, 11_242, 'e1', 'experts')],
    });
    expect(progressAfter(lateLeftover, claim('job-lv', 2, 'experts~e1'), 0, false)?.what).toBe('transcripts/ta4');
  });

  test('a target whose job had ended by the fault is not counted: the stopped job\'s later bookkeeping is no recovery', () => {
    // The owner cancelled at 900; the fault took effect at 1 000; the stopped-effects check reconciled a minute later.
    const cancelled = job('job-x', { events: [event('e1', 'claimed', 2, 0), event('e2', 'cancelled', 2, 900), event('e3', 'effects-reconciled', 2, 61_000)] });
    const fault: FaultRecord = { index: 1, kind: 'commit-answer-lost', atMs: 1_000, targets: [claim('job-x', 2)] };
    expect(recoveryByKind([fault], [cancelled], ['commit-answer-lost'])).toEqual([]);
    // Cancelled after the fault: the job's end is its recovery, as before.
    expect(recoveryByKind([{ ...fault, atMs: 500 }], [cancelled], ['commit-answer-lost']).map(figures)[0]?.worstMs).toBe(400);
  });

  test('no progress after the fault: not recovered, and named apart', () => {
    const stuck = job('job-s', { events: [event('e1', 'claimed', 1, 0)], transcripts: [transcript('t1', 1, 1_000)] });
    const faults: FaultRecord[] = [{ index: 4, kind: 'worker-freeze', atMs: 2_000, targets: [claim('job-s', 1)] }];
    const [row] = recoveryByKind(faults, [stuck], ['worker-freeze']);
    expect(row?.recovered).toEqual([]);
    expect(row?.notRecovered.map((item) => [item.fault.index, item.jobId])).toEqual([[4, 'job-s']]);
  });

  test('a fault that hit several jobs counts its slowest; one that hit nothing is not counted', () => {
    const quick = job('job-q', { transcripts: [transcript('t1', 1, 3_000)] });
    const faults: FaultRecord[] = [
      { index: 1, kind: 'checkpoint-write-failure', atMs: 1_000, targets: [{ jobId: 'job-k', unit: null, epoch: null }, { jobId: 'job-q', unit: null, epoch: null }] },
      { index: 2, kind: 'checkpoint-write-failure', atMs: 1_000, targets: [] },
      { index: 3, kind: 'worker-kill', atMs: 2_500, targets: [claim('job-k', 1)] },
    ];
    const rows = recoveryByKind(faults, [killed, quick], ['worker-kill', 'lease-expiry', 'checkpoint-write-failure']).map(figures);
    expect(rows.map((row) => [row.kind, row.n, row.worstMs, row.worst?.jobId, row.worst?.fault])).toEqual([
      ['worker-kill', 1, 8_500, 'job-k', 3],
      // job-k's next save after 1 000 is t2 at 2 000 (1 s); job-q's at 3 000 (2 s): the slowest.
      ['checkpoint-write-failure', 1, 2_000, 'job-q', 1],
    ]);
    // The Firestore fault's recovery of job-k (at 2 000) came before the kill (2 500): no overlap; the kill overlapped nothing.
    expect(rows.map((row) => row.overlapped)).toEqual([0, 0]);
    const table = formatRecovery(rows);
    expect(table[1]).toMatch(/^ {2}worker-kill +1 +8\.5 +8\.5 +8\.5 +8\.5 +0 +0 +0 +8\.5 {2}job-k \(#3\)$/);
  });

  test('a recovery during which another fault hit the same job is flagged as overlapped', () => {
    const faults: FaultRecord[] = [
      { index: 1, kind: 'worker-kill', atMs: 2_500, targets: [claim('job-k', 1)] },
      { index: 2, kind: 'duplicate-delivery', atMs: 5_000, targets: [{ jobId: 'job-k', unit: null, epoch: null }] },
      { index: 3, kind: 'duplicate-delivery', atMs: 20_000, targets: [{ jobId: 'job-k', unit: null, epoch: null }] },
    ];
    const rows = recoveryByKind(faults, [killed], ['worker-kill', 'duplicate-delivery']).map(figures);
    // Fault #2 fell inside the kill's 8.5 s; fault #3 came after the job's end: not counted.
    expect(rows.map((row) => [row.kind, row.n, row.overlapped, row.notRecovered])).toEqual([
      ['worker-kill', 1, 1, 0],
      ['duplicate-delivery', 1, 0, 0],
    ]);
    // The kill's only recovery was overlapped: nothing is left for its alone figure.
    expect(rows[0]?.aloneP99Ms).toBeNaN();
  });
});

describe('chaos recovery: waits', () => {
  const status = (item: EventDoc, value: string): EventDoc => ({ ...item, status: value });
  /** Job events in order, each with the job's status as of its commit: [kind, epoch, at ms, status]. */
  const timeline = (prefix: string, rows: readonly (readonly [string, number, number, string])[]): EventDoc[] =>
    rows.map(([kind, epoch, atMs, value], index) => status(event(`${prefix}${index + 1}`, kind, epoch, atMs), value));
  // Unit e1 (epoch 1) is killed at 3 000 while the job waits for the provider (2 000 to 40 000); the
  // wait ends, a new claim finishes the unit at 41 000. Job-q's kill at 3 000 is taken over at 10 000.
  const parked = job('job-p', {
    events: [
      ...timeline('p', [
        ['claimed', 1, 500, 'running'],
        ['waiting', 1, 2_000, 'waiting'],
        ['resumed', 1, 40_000, 'queued'],
        ['claimed', 2, 40_500, 'running'],
      ]),
      status(unitEvent('unit-done', 'expert', 'e1', 2, 41_000), 'running'),
    ],
  });
  const quick = job('job-q', {
    events: timeline('q', [
      ['claimed', 1, 500, 'running'],
      ['reclaimed', 1, 10_000, 'queued'],
      ['claimed', 2, 10_200, 'running'],
    ]),
    transcripts: [transcript('t1', 2, 11_000)],
  });

  test("a recovery during which the job was parked in a wait is flagged, and its alone figure is less the wait's time", () => {
    // Job-s is killed at 3 000 and waits only 10 000 to 10 500; its recovery at 63 000 is slow for another reason.
    const slow = job('job-s', {
      events: timeline('s', [
        ['claimed', 1, 500, 'running'],
        ['waiting', 1, 10_000, 'waiting'],
        ['resumed', 1, 10_500, 'queued'],
        ['claimed', 2, 62_000, 'running'],
      ]),
      transcripts: [transcript('t1', 2, 63_000)],
    });
    const faults: FaultRecord[] = [
      { index: 1, kind: 'worker-kill', atMs: 3_000, targets: [claim('job-p', 1, 'expert~e1')] },
      { index: 2, kind: 'worker-kill', atMs: 3_000, targets: [claim('job-q', 1)] },
    ];
    const [row] = recoveryByKind(faults, [parked, quick], ['worker-kill']).map(figures);
    // Job-p's 38 s hold 37 s of wait: 1 s of its own; job-q's 8 s is the alone p99.
    expect(row && [row.n, row.worstMs, row.held, row.overlapped, row.aloneP99Ms]).toEqual([2, 38_000, 1, 0, 8_000]);
    expect(formatRecovery(row ? [row] : [])[1]).toMatch(/^ {2}worker-kill +2 +8\.0 +38\.0 +38\.0 +38\.0 +0 +0 +1 +8\.0 {2}job-p \(#1\)$/);
    const [withSlow] = recoveryByKind([...faults, { index: 3, kind: 'worker-kill', atMs: 3_000, targets: [claim('job-s', 1)] }], [parked, quick, slow], ['worker-kill']).map(figures);
    expect(withSlow && [withSlow.n, withSlow.held, withSlow.aloneP99Ms]).toEqual([3, 2, 59_500]);
  });

  test('the time a job waited counts only between the fault and the progress', () => {
    const waited = (fromMs: number, untilMs: number): number => waitedBetween(parked, us(fromMs), us(untilMs)) / 1000;
    // Inside, across either end, and around the whole wait (2 000 to 40 000).
    expect([waited(3_000, 41_000), waited(1_000, 3_000), waited(39_000, 45_000), waited(1_000, 45_000)]).toEqual([37_000, 1_000, 1_000, 38_000]);
    // Wholly before the wait, or wholly after it.
    expect([waited(600, 1_900), waited(40_100, 45_000)]).toEqual([0, 0]);
    // A job still waiting at the end of the timeline is parked from its waiting event on.
    const stillWaiting = job('job-w', { events: [status(event('w1', 'waiting', 1, 2_000), 'waiting')] });
    expect([waitedBetween(stillWaiting, us(5_000), us(9_000)), waitedBetween(stillWaiting, us(0), us(1_000))]).toEqual([us(4_000), 0]);
    // An event that names no status ends the wait: what is not known to be a wait is not taken out.
    const unknownAfter = job('job-u', { events: [status(event('u1', 'waiting', 1, 2_000), 'waiting'), event('u2', 'resumed', 1, 5_000)] });
    expect(waitedBetween(unknownAfter, us(1_000), us(10_000))).toBe(us(3_000));
    // An event at the progress itself is not inside the gap.
    expect(waitedBetween(parked, us(1_000), us(2_000))).toBe(0);
  });
});

describe('chaos recovery: percentiles', () => {
  test('nearest rank: p50 of 1..10 is 5, p95 and p99 the worst; one value is every percentile', () => {
    const values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
    expect([percentile(values, 50), percentile(values, 95), percentile(values, 99)]).toEqual([5, 10, 10]);
    const hundred = Array.from({ length: 200 }, (_, index) => index + 1);
    expect([percentile(hundred, 50), percentile(hundred, 95), percentile(hundred, 99)]).toEqual([100, 190, 198]);
    expect([percentile([7], 50), percentile([7], 99)]).toEqual([7, 7]);
    expect(percentile([], 50)).toBeNaN();
  });
});
