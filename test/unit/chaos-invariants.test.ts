/**
 * The soak's invariant checker, fed synthetic documents: a clean run passes every invariant, and
 * each kind of breakage is flagged by the invariant that names it (and by no unrelated one).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { trace } from '@opentelemetry/api';
import type { UnitView } from '../../functions/src/core/invariants';
import { newQueuedJob, type JobRecord } from '../../functions/src/core/job';
import { createCorpusToolbox } from '../../functions/src/providers/offline/toolbox';
import { runInStep, StepScope, type StepFields } from '../../functions/src/telemetry/scope';
import { checkInvariants, checkTimelines, ownedWrites, UNIT_EVENT_ID, type InvariantName, type InvariantResult } from '../../scripts/chaos/invariants';
import type { CollectedJob, EffectDoc, EventDoc, JobDoc, Observed, ReceiverView, Submission, ToolExecution, ToolResultSeen } from '../../scripts/chaos/model';
import { readToolExecutions } from '../../scripts/chaos/tool-calls';

const RESEARCH_COST = { modelCalls: 10, toolCalls: 6, spentUsd: 0.01, wastedModelCalls: 1, wastedUsd: 0.001 };
/** What the research job's one expert unit spent: 3 model calls (one wasted), 1 tool call. */
const EXPERT_COST = { modelCalls: 3, toolCalls: 1, spentUsd: 0.003, wastedModelCalls: 1, wastedUsd: 0.001 };

const jobDoc = (overrides: Partial<JobDoc> = {}): JobDoc => ({
  status: 'completed',
  outcome: 'complete',
  pipeline: 'research',
  idempotencyKey: 'key-0',
  owner: 'user-1',
  epoch: 5,
  staleReclaims: 0,
  attempts: 0,
  waiting: null,
  lastError: null,
  quarantine: null,
  cancellation: null,
  cost: RESEARCH_COST,
  decisions: {},
  ...overrides,
});

/** The job as the engine decodes it (for the stranded-job check): completed unless told otherwise. */
const jobRecord = (id: string, overrides: Partial<JobRecord> = {}): JobRecord => ({
  ...newQueuedJob({ id, owner: 'user-1', pipeline: 'research', input: {}, conversationId: null, idempotencyKey: null }, 0),
  status: 'completed',
  outcome: 'complete',
  epoch: 5,
  step: 4,
  nextRunAtMs: 1_000,
  eventSeq: 12,
  updatedAtMs: 1_000,
  finishedAtMs: 1_000,
  ...overrides,
});

/** A unit event ID as store/job-store.ts writeUnitEvents builds it. */
const unitEventId = (atMs: number, phase: string, unit: string, epoch: number, index = 0): string =>
  `u-${String(atMs).padStart(14, '0')}-${phase}~${unit}-${String(epoch).padStart(4, '0')}-0123456789ab-${index}`;

const event = (seq: number, kind: string, epoch: number, commitUs: number, unit: string | null = null): EventDoc => ({
  id: `j${String(seq).padStart(8, '0')}`,
  kind,
  epoch,
  unit,
  commitUs,
});

/** A research job that went outline → perspectives → one expert unit → final document → completed, cleanly. */
function researchJob(id = 'job-r', key = 'key-0'): CollectedJob {
  return {
    id,
    job: jobDoc({ idempotencyKey: key }),
    events: [
      event(1, 'submitted', 0, 100),
      event(2, 'claimed', 1, 200),
      event(3, 'checkpointed', 1, 400),
      event(4, 'claimed', 2, 500),
      event(5, 'checkpointed', 2, 550),
      event(6, 'claimed', 3, 600),
      event(7, 'fanned-out', 3, 610),
      { id: unitEventId(650, 'expert-content', 'e1', 1), kind: 'yielded', epoch: 3, unit: 'e1', commitUs: 650 },
      event(8, 'joined', 3, 800, 'e1'),
      event(9, 'claimed', 4, 850),
      event(10, 'checkpointed', 4, 950),
      event(11, 'claimed', 5, 980),
      event(12, 'completed', 5, 1000),
    ],
    sections: [
      { id: 'expert-content~e1~h1', phase: 'expert-content', unit: 'e1', sectionId: 'h1', epoch: 1, commitUs: 700 },
      { id: 'final-document~-~h1', phase: 'final-document', unit: null, sectionId: 'h1', epoch: 4, commitUs: 900 },
    ],
    checkpoints: [
      { phase: 'outline', epoch: 1, commitUs: 400 },
      { phase: 'perspectives', epoch: 2, commitUs: 550 },
      { phase: 'expert-content', epoch: 3, commitUs: 800 },
      { phase: 'final-document', epoch: 4, commitUs: 950 },
    ],
    transcripts: [
      { id: 'outline~-~outline', phase: 'outline', unit: null, sectionId: 'outline', epoch: 1, commitUs: 300, generation: 0, modelCalls: 3, wastedModelCalls: 0, toolResultIds: [`${id}_call_0`, `${id}_call_1`] },
      { id: 'perspectives~-~perspectives', phase: 'perspectives', unit: null, sectionId: 'perspectives', epoch: 2, commitUs: 520, generation: 0, modelCalls: 2, wastedModelCalls: 0, toolResultIds: [] },
      { id: 'expert-content~e1~h1', phase: 'expert-content', unit: 'e1', sectionId: 'h1', epoch: 1, commitUs: 690, generation: 0, modelCalls: 3, wastedModelCalls: 1, toolResultIds: [`${id}_call_2`] },
      { id: 'final-document~-~h1', phase: 'final-document', unit: null, sectionId: 'h1', epoch: 4, commitUs: 880, generation: 0, modelCalls: 2, wastedModelCalls: 0, toolResultIds: [] },
    ],
    effects: [],
    results: [{ path: `jobs/${id}/results/final`, outcome: 'complete', missing: [], commitUs: 1000 }],
    // Its cost: the expert unit's, all counted in the job, and the job claims' own (the last one's tally kept).
    record: jobRecord(id, { cost: RESEARCH_COST, claimTally: { epoch: 5, cost: { modelCalls: 2, spentUsd: 0.002 }, notes: 0 } }),
    recordProblem: null,
    units: [{ unit: 'e1', phase: 'expert-content', fanoutEpoch: 3, status: 'done', lease: null, nextRunAtMs: 650 }],
    unitProblems: [],
    unitCosts: [{ unit: 'e1', phase: 'expert-content', fanoutEpoch: 3, status: 'done', cost: EXPERT_COST, costInJob: EXPERT_COST }],
    stamped: [],
  };
}

const effect = (key: string, identity: string, overrides: Partial<EffectDoc> = {}): EffectDoc => ({
  key,
  idempotencyKey: key,
  unit: null,
  state: 'applied',
  kind: 'message',
  identity,
  epoch: 2,
  commitUs: 450,
  lastOutcome: 'applied by the receiver',
  resolution: null,
  ...overrides,
});

/** A notify job with two recipients: each message sent and logged, every effect applied once. */
function notifyJob(id = 'job-n', key = 'key-1'): CollectedJob {
  return {
    id,
    job: jobDoc({ pipeline: 'notify', idempotencyKey: key, epoch: 2, cost: {} }),
    events: [event(1, 'submitted', 0, 100), event(2, 'claimed', 1, 200), event(3, 'checkpointed', 1, 300), event(4, 'claimed', 2, 400), event(5, 'completed', 2, 600)],
    sections: [],
    checkpoints: [
      { phase: 'plan', epoch: 1, commitUs: 300 },
      { phase: 'send', epoch: 2, commitUs: 600 },
    ],
    transcripts: [],
    effects: [
      effect('fx_a', 'c/c001'),
      effect('fx_b', 'c/c001', { kind: 'record' }),
      effect('fx_c', 'c/c002'),
      effect('fx_d', 'c/c002', { kind: 'record' }),
    ],
    results: [{ path: `jobs/${id}/results/final`, outcome: 'complete', missing: [], commitUs: 600 }],
    record: jobRecord(id, { pipeline: 'notify', epoch: 2 }),
    recordProblem: null,
    units: [],
    unitProblems: [],
    unitCosts: [],
    stamped: [],
  };
}

const cleanReceiver = (): ReceiverView => ({
  applications: [
    { key: 'fx_a', kind: 'message', identity: 'c/c001' },
    { key: 'fx_b', kind: 'record', identity: 'c/c001' },
    { key: 'fx_c', kind: 'message', identity: 'c/c002' },
    { key: 'fx_d', kind: 'record', identity: 'c/c002' },
  ],
  requests: [
    { op: 'apply', key: 'fx_a', outcome: 201 },
    { op: 'apply', key: 'fx_b', outcome: 201 },
    { op: 'apply', key: 'fx_c', outcome: 201 },
    { op: 'apply', key: 'fx_d', outcome: 201 },
  ],
});

const submission = (index: number, taskIds: string[], key = `key-${index}`): Submission => ({ index, pipeline: 'research', idempotencyKey: key, taskIds, failure: null });

/** Every tool call of the research job ran once, before its transcript recorded it (commits at 300 and 690 µs). */
const execution = (callId: string, startedAtMs: number, delivered = true): ToolExecution => ({ callId, tool: 'search', startedAtMs, delivered, pid: 4242 });
const cleanExecutions = (): ToolExecution[] => [execution('job-r_call_0', 0), execution('job-r_call_1', 0), execution('job-r_call_2', 0)];

function clean(): Observed & { jobs: CollectedJob[] } {
  return {
    jobs: [researchJob(), notifyJob()],
    submissions: [submission(0, ['job-r']), submission(1, ['job-n'])],
    receiver: cleanReceiver(),
    toolResultsSeen: [],
    toolExecutions: cleanExecutions(),
  };
}

/** The invariants that flagged something, with their counts. */
function broken(observed: Observed): Partial<Record<InvariantName, number>> {
  const out: Partial<Record<InvariantName, number>> = {};
  for (const invariant of checkInvariants(observed).invariants) if (invariant.violations.length > 0) out[invariant.name] = invariant.violations.length;
  return out;
}

/** Replaces one job of the clean set. */
function withJob(id: string, change: (job: CollectedJob) => CollectedJob): Observed {
  const base = clean();
  return { ...base, jobs: base.jobs.map((job) => (job.id === id ? change(job) : job)) };
}

describe('chaos invariant checker', () => {
  test('a clean run breaks nothing, and its statistics add up', () => {
    const report = checkInvariants(clean());
    expect(report.invariants.filter((invariant) => invariant.violations.length > 0)).toEqual([]);
    expect(report.invariants).toHaveLength(18);
    expect(report.stats.byState.get('completed (complete)')).toBe(2);
    expect(report.stats.sectionsTotal).toBe(4);
    expect(report.stats.sectionsRecomputed).toBe(1);
    expect(report.stats.wasted.get('wastedModelCalls')).toBe(1);
    expect(report.stats.claims).toBe(7);
    expect(report.stats.receiverFaultyAnswers.size).toBe(0);
    const base = clean();
    const spoiled = checkInvariants({ ...base, receiver: { ...base.receiver, requests: [...base.receiver.requests, { op: 'apply', key: 'fx_a', outcome: 'hung' }, { op: 'lookup', key: 'fx_a', outcome: 503 }] } });
    expect([...spoiled.stats.receiverFaultyAnswers]).toEqual([
      ['apply hung', 1],
      ['lookup 503', 1],
    ]);
  });

  test('jobs lost: a job left running, a provider wait without a resume time, an accepted task with no document', () => {
    expect(broken(withJob('job-r', (job) => ({ ...job, job: { ...job.job, status: 'running' }, results: [], events: job.events.slice(0, -1) })))).toEqual({
      jobsLost: 1,
      withoutReason: 1,
    });
    const providerWait = { reason: 'provider', questionId: 'provider', question: 'Provider down', options: [], untilMs: null };
    expect(broken(withJob('job-r', (job) => ({ ...job, job: { ...job.job, status: 'waiting', waiting: providerWait }, results: [], events: job.events.slice(0, -1) })))).toEqual({
      jobsLost: 1,
      withoutReason: 1,
    });
    const base = clean();
    expect(broken({ ...base, jobs: base.jobs.filter((job) => job.id !== 'job-r') })).toEqual({ jobsLost: 1 });
  });

  test('a job waiting for a person with a question is neither lost nor without a reason', () => {
    const decision = { reason: 'decision', questionId: 'unknown-effects-1', question: 'Could not check…', options: ['retry the unknown ones'], untilMs: null };
    const waiting = withJob('job-n', (job) => ({ ...job, job: { ...job.job, status: 'waiting', waiting: decision }, results: [], events: job.events.slice(0, -1) }));
    expect(broken(waiting)).toEqual({});
    expect(checkInvariants(waiting).stats.notWhole).toEqual([{ jobId: 'job-n', pipeline: 'notify', state: 'waiting (decision)', reason: 'unknown-effects-1: Could not check…' }]);
    expect(checkInvariants(clean()).stats.notWhole).toEqual([]);
  });

  test('submissions never accepted', () => {
    const base = clean();
    expect(broken({ ...base, submissions: [...base.submissions, { ...submission(2, []), failure: 'gave up after 9 tries' }] })).toEqual({ submissionsNotAccepted: 1 });
  });

  test('duplicate jobs: one key answered with two task IDs, or a job nobody submitted', () => {
    const base = clean();
    const second = { ...researchJob('job-r2', 'key-0') };
    expect(broken({ ...base, jobs: [...base.jobs, second], submissions: [submission(0, ['job-r', 'job-r2']), submission(1, ['job-n'])] })).toEqual({ duplicateJobs: 1 });
    expect(broken({ ...base, jobs: [...base.jobs, second] })).toEqual({ duplicateJobs: 1 });
  });

  test('duplicate published results: two answers, or two completed events', () => {
    expect(broken(withJob('job-r', (job) => ({ ...job, results: [...job.results, { path: 'conversations/c/messages/job-r', outcome: 'complete', missing: [], commitUs: 1000 }] })))).toEqual({
      duplicatePublished: 1,
    });
    expect(broken(withJob('job-n', (job) => ({ ...job, events: [...job.events, event(6, 'completed', 2, 600)] })))).toEqual({ duplicatePublished: 1 });
  });

  test('results that disagree with the job', () => {
    const failed = (job: CollectedJob): CollectedJob => ({ ...job, job: { ...job.job, status: 'failed', outcome: null, lastError: { code: 'terminal', message: 'boom' } } });
    expect(broken(withJob('job-r', failed))).toEqual({ resultsDisagree: 1 });
    expect(broken(withJob('job-r', (job) => ({ ...job, results: [] })))).toEqual({ resultsDisagree: 1 });
    expect(broken(withJob('job-r', (job) => ({ ...job, job: { ...job.job, outcome: 'partial' } })))).toEqual({ resultsDisagree: 1, withoutReason: 1 });
  });

  test('duplicate effects: one key applied twice, or one effect applied under two keys', () => {
    const base = clean();
    expect(broken({ ...base, receiver: { ...base.receiver, applications: [...base.receiver.applications, { key: 'fx_a', kind: 'message', identity: 'c/c001' }] } })).toEqual({
      duplicateEffects: 1,
    });
    const rekeyed = withJob('job-n', (job) => ({ ...job, effects: [...job.effects, effect('fx_e', 'c/c001')] }));
    expect(broken({ ...rekeyed, receiver: { ...base.receiver, applications: [...base.receiver.applications, { key: 'fx_e', kind: 'message', identity: 'c/c001' }] } })).toEqual({
      duplicateEffects: 1,
    });
  });

  test('effects the ledger misreports', () => {
    const base = clean();
    // Applied according to the ledger, never at the receiver.
    expect(broken({ ...base, receiver: { ...base.receiver, applications: base.receiver.applications.filter((item) => item.key !== 'fx_d') } })).toEqual({ effectsMisreported: 1 });
    // Applied at the receiver, "not sent" in the ledger.
    const failedEntry = withJob('job-n', (job) => ({ ...job, effects: job.effects.map((item) => (item.key === 'fx_c' ? { ...item, state: 'failed' } : item)) }));
    expect(broken(failedEntry)).toEqual({ effectsMisreported: 1 });
    // Applied at the receiver under a key no job recorded.
    expect(broken({ ...base, receiver: { ...base.receiver, applications: [...base.receiver.applications, { key: 'fx_zz', kind: 'message', identity: 'c/c009' }] } })).toEqual({
      effectsMisreported: 1,
    });
  });

  test('an effect still unknown at the receiver is not a misreport while the job waits on it', () => {
    const decision = { reason: 'decision', questionId: 'unknown-effects-1', question: 'Could not check…', options: ['retry the unknown ones'], untilMs: null };
    expect(
      broken(
        withJob('job-n', (job) => ({
          ...job,
          job: { ...job.job, status: 'waiting', waiting: decision },
          results: [],
          events: job.events.slice(0, -1),
          checkpoints: job.checkpoints.slice(0, 1),
          effects: job.effects.map((item) => (item.key === 'fx_d' ? { ...item, state: 'unknown', commitUs: 550 } : item)),
        })),
      ),
    ).toEqual({});
  });

  test('stale writes: a section written under an epoch older than a claim already recorded', () => {
    // The final section carries epoch 3 but landed after the claim of epoch 4 (commit 850).
    expect(
      broken(withJob('job-r', (job) => ({ ...job, sections: job.sections.map((item) => (item.unit === null ? { ...item, epoch: 3 } : item)) }))),
    ).toEqual({ staleWrites: 1 });
  });

  test('stale writes: a unit write older than a later write of the same unit', () => {
    // Unit e1's section of epoch 1 landed at 700, after the unit's own event of epoch 2 (at 650).
    const later = { id: unitEventId(650, 'expert-content', 'e1', 2), kind: 'yielded', epoch: 3, unit: 'e1', commitUs: 650 };
    expect(broken(withJob('job-r', (job) => ({ ...job, events: job.events.map((item) => (item.id.startsWith('u-') ? later : item)) })))).toEqual({ staleWrites: 2 });
    // Another unit's epochs are its own: no evidence against e1.
    const other = { id: unitEventId(650, 'expert-content', 'e2', 7), kind: 'yielded', epoch: 3, unit: 'e2', commitUs: 650 };
    expect(broken(withJob('job-r', (job) => ({ ...job, events: [...job.events, other] })))).toEqual({});
    // Units are keyed by phase: a unit of the same name in another phase has its own epochs.
    const samePhaseLater = { id: unitEventId(650, 'final-document', 'e1', 7), kind: 'yielded', epoch: 3, unit: 'e1', commitUs: 650 };
    expect(broken(withJob('job-r', (job) => ({ ...job, events: [...job.events, samePhaseLater] })))).toEqual({});
  });

  test('stale writes: anything owned, or an answer, committed after the job ended', () => {
    expect(
      broken(withJob('job-r', (job) => ({ ...job, transcripts: job.transcripts.map((item) => (item.id === 'outline~-~outline' ? { ...item, epoch: 5, commitUs: 1200 } : item)) }))),
    ).toEqual({ staleWrites: 1, redoneAfterCheckpoint: 1 });
    expect(broken(withJob('job-n', (job) => ({ ...job, effects: job.effects.map((item) => (item.key === 'fx_a' ? { ...item, commitUs: 700 } : item)) })))).toEqual({
      staleWrites: 1,
    });
    const failedThenPublished = withJob('job-r', (job) => ({
      ...job,
      job: { ...job.job, status: 'failed', outcome: null, lastError: { code: 'terminal', message: 'boom' } },
      events: [...job.events.slice(0, -1), event(12, 'failed', 5, 990)],
    }));
    expect(broken(failedThenPublished)).toEqual({ staleWrites: 1, resultsDisagree: 1 });
  });

  test('the reconciliation after a stop writes without a claim and is not a stale write', () => {
    const stopped = withJob('job-n', (job) => ({
      ...job,
      job: { ...job.job, status: 'cancelled', outcome: null, cancellation: { reason: 'owner', effectsSettled: true } },
      results: [],
      events: [...job.events.slice(0, -1), event(5, 'cancelled', 2, 500)],
      checkpoints: job.checkpoints.slice(0, 1),
      effects: job.effects.map((item) =>
        item.key === 'fx_d' ? { ...item, commitUs: 900, lastOutcome: 'found at the receiver by lookup after the job stopped' } : item,
      ),
    }));
    expect(broken(stopped)).toEqual({});
    expect(ownedWrites(stopped.jobs.find((job) => job.id === 'job-n') as CollectedJob).map((write) => write.id)).not.toContain('fx_d');
  });

  test('jobs without a stated reason', () => {
    const failedSilently = (job: CollectedJob): CollectedJob => ({
      ...job,
      job: { ...job.job, status: 'failed', outcome: null, lastError: null },
      results: [],
      events: [...job.events.slice(0, -1), event(12, 'failed', 5, 1000)],
    });
    expect(broken(withJob('job-r', failedSilently))).toEqual({ withoutReason: 1 });
    const quarantined = (job: CollectedJob): CollectedJob => ({ ...failedSilently(job), job: { ...job.job, status: 'quarantined', outcome: null, quarantine: { reason: ' ' } } });
    expect(broken(withJob('job-r', quarantined))).toEqual({ withoutReason: 1 });
    const partial = (job: CollectedJob): CollectedJob => ({ ...job, job: { ...job.job, outcome: 'partial' }, results: job.results.map((item) => ({ ...item, outcome: 'partial' })) });
    expect(broken(withJob('job-r', partial))).toEqual({ withoutReason: 1 });
    const named = (job: CollectedJob): CollectedJob => ({ ...partial(job), results: job.results.map((item) => ({ ...item, outcome: 'partial', missing: ['an expert · h1'] })) });
    expect(broken(withJob('job-r', named))).toEqual({});
  });

  test('sections redone after their checkpoint', () => {
    // The expert section's transcript saved again after its section was committed (same epoch: not stale, but redone).
    expect(
      broken(withJob('job-r', (job) => ({ ...job, transcripts: job.transcripts.map((item) => (item.unit === 'e1' ? { ...item, commitUs: 750 } : item)) }))),
    ).toEqual({ redoneAfterCheckpoint: 1 });
    // Outline has no section document: its phase checkpoint is the boundary.
    expect(
      broken(withJob('job-r', (job) => ({ ...job, transcripts: job.transcripts.map((item) => (item.id === 'outline~-~outline' ? { ...item, commitUs: 450 } : item)) }))),
    ).toEqual({ redoneAfterCheckpoint: 1 });
  });

  test('chaos: unit event IDs in the engine\'s format name the unit document and its epoch', () => {
    const match = UNIT_EVENT_ID.exec(unitEventId(1_764_500_000_123, 'expert-content', 'risk-analyst-2', 12, 3));
    expect(match?.slice(1, 4)).toEqual(['expert-content', 'risk-analyst-2', '0012']);
    // Job events and the retired format (unit first) are not unit writes.
    expect(UNIT_EVENT_ID.test('j00000012')).toBe(false);
    expect(UNIT_EVENT_ID.test('u-e1-0001-00000000000650-0')).toBe(false);
    const events = ownedWrites(researchJob()).filter((write) => write.collection === 'events');
    expect(events).toEqual([{ collection: 'events', id: unitEventId(650, 'expert-content', 'e1', 1), unit: 'expert-content~e1', epoch: 1, commitUs: 650 }]);
  });

  const strandedOf = (observed: Observed): InvariantResult | undefined => checkInvariants(observed).invariants.find((invariant) => invariant.name === 'stranded');
  const withRecord = (record: Partial<JobRecord>, units?: UnitView[]): Observed =>
    withJob('job-r', (job) => ({ ...job, record: jobRecord('job-r', record), ...(units === undefined ? {} : { units }) }));

  test('chaos: stranded jobs: not terminal, and nothing (lease, live unit, due time) will move them', () => {
    const fanout = { phase: 'expert-content', epoch: 3, units: 1, done: 0 };
    const unit = (overrides: Partial<UnitView>): UnitView => ({ unit: 'e1', phase: 'expert-content', fanoutEpoch: 3, status: 'queued', lease: null, nextRunAtMs: 700, ...overrides });
    const lease = { epoch: 5, worker: 'w-1', expiresAtMs: 2_000 };
    // Violating: running with neither lease nor fan-out; a fan-out whose units are done or from an older fan-out; no due time.
    expect(strandedOf(withRecord({ status: 'running' }))?.violations).toEqual([{ jobId: 'job-r', detail: 'running: running with neither a lease nor a fan-out' }]);
    expect(strandedOf(withRecord({ status: 'running', fanout }, [unit({ status: 'done' })]))?.violations).toHaveLength(1);
    expect(strandedOf(withRecord({ status: 'running', fanout }, [unit({ fanoutEpoch: 2 })]))?.violations).toHaveLength(1);
    expect(strandedOf(withRecord({ status: 'queued', nextRunAtMs: Number.POSITIVE_INFINITY }))?.violations).toHaveLength(1);
    const providerWait = { reason: 'provider' as const, questionId: 'provider', question: 'Provider down', options: [], untilMs: null };
    expect(strandedOf(withRecord({ status: 'waiting', waiting: providerWait }))?.violations).toHaveLength(1);
    // A document the engine cannot decode, or a live job's unit it cannot decode.
    expect(strandedOf(withJob('job-r', (job) => ({ ...job, record: null, recordProblem: 'Job job-r has a malformed document' })))?.violations).toHaveLength(1);
    const unreadableUnit = withJob('job-r', (job) => ({ ...job, record: jobRecord('job-r', { status: 'running', lease }), unitProblems: ['expert-content~e2: malformed'] }));
    expect(strandedOf(unreadableUnit)?.violations).toHaveLength(1);
    // Clean: leased; a fan-out with a queued or a leased unit; queued with a due time; waiting for a person; terminal.
    expect(strandedOf(withRecord({ status: 'running', lease }))?.violations).toEqual([]);
    expect(strandedOf(withRecord({ status: 'running', fanout }, [unit({ status: 'done', unit: 'e0' }), unit({})]))?.violations).toEqual([]);
    expect(strandedOf(withRecord({ status: 'running', fanout }, [unit({ status: 'running', lease })]))?.violations).toEqual([]);
    expect(strandedOf(withRecord({ status: 'queued', nextRunAtMs: 5_000 }))?.violations).toEqual([]);
    const decision = { reason: 'decision' as const, questionId: 'q1', question: 'Which?', options: ['a', 'b'], untilMs: null };
    expect(strandedOf(withRecord({ status: 'waiting', waiting: decision }))?.violations).toEqual([]);
    expect(strandedOf(withJob('job-r', (job) => ({ ...job, unitProblems: ['expert-content~e2: malformed'] })))?.violations).toEqual([]);
    expect(broken(clean())).toEqual({});
  });

  /** The notify job, cancelled mid-send, with its ledger as the settling sweep left it. */
  const cancelledNotify = (state: string, effectsSettled: boolean | null): Observed =>
    withJob('job-n', (job) => ({
      ...job,
      job: { ...job.job, status: 'cancelled', outcome: null, cancellation: { reason: 'owner', effectsSettled } },
      record: jobRecord('job-n', { pipeline: 'notify', status: 'cancelled', outcome: null }),
      results: [],
      events: [...job.events.slice(0, -1), event(5, 'cancelled', 2, 500)],
      checkpoints: job.checkpoints.slice(0, 1),
      effects: job.effects.map((item) => (item.key === 'fx_d' ? { ...item, state, commitUs: 450, lastOutcome: 'the receiver did not answer in time' } : item)),
    }));

  test('chaos: unsettled effects on a stopped job after the grace period', () => {
    // Violating: an entry left unknown or applying; a cancellation record that still says unsettled.
    expect(broken(cancelledNotify('unknown', false))).toEqual({ unsettledAfterStop: 1 });
    expect(broken(cancelledNotify('applying', null))).toEqual({ unsettledAfterStop: 1 });
    const [violation] = checkInvariants(cancelledNotify('unknown', false)).invariants.find((item) => item.name === 'unsettledAfterStop')?.violations ?? [];
    expect(violation?.detail).toMatch(/cancelled job: record c\/c002 \(fx_d\) still unknown/);
    expect(broken(cancelledNotify('applied', false))).toEqual({ unsettledAfterStop: 1 });
    // Clean: every entry settled, as the sweep leaves it (applied, found applied, or not applied).
    expect(broken(cancelledNotify('applied', true))).toEqual({});
    // The ledger says failed while the receiver applied it: a misreport, not an unsettled entry.
    expect(broken(cancelledNotify('failed', true))).toEqual({ effectsMisreported: 1 });
    // A job still waiting on its unknown effects is not stopped (a person will answer): the test above.
  });

  test('chaos: no tool call ID executed again after its result was recorded', () => {
    const base = clean();
    const repeated = (observed: Observed): string[] =>
      (checkInvariants(observed).invariants.find((item) => item.name === 'toolCallRepeated')?.violations ?? []).map((item) => item.detail);
    // Violating: a recorded call ran again later (1 ms = 1000 µs, after the commit at 300 µs).
    expect(broken({ ...base, toolExecutions: [...cleanExecutions(), execution('job-r_call_1', 1)] })).toEqual({ toolCallRepeated: 1 });
    expect(repeated({ ...base, toolExecutions: [...cleanExecutions(), execution('job-r_call_1', 1, false)] })).toEqual([
      'search call job-r_call_1 ran 1 more time(s) after transcript outline~-~outline recorded its result at 300 µs (first at 1000 µs in process 4242; 2 executions in all)',
    ]);
    // A result recorded and later dropped from the thread (only the listener saw it), then produced again.
    const seen: ToolResultSeen = { jobId: 'job-r', transcript: 'perspectives~-~perspectives', callId: 'job-r_call_9', commitUs: 510 };
    expect(broken({ ...base, toolResultsSeen: [seen], toolExecutions: [...cleanExecutions(), execution('job-r_call_9', 0), execution('job-r_call_9', 2)] })).toEqual({
      toolCallRepeated: 1,
    });
    // One call ID recorded by two jobs: its executions cannot be told apart.
    expect(broken({ ...base, toolResultsSeen: [{ ...seen, jobId: 'job-n', callId: 'job-r_call_0' }] })).toEqual({ toolCallRepeated: 1 });
    // Clean: runs before the record (an interrupted result, a worker lost before its save) are at-least-once work.
    const rerunBeforeRecord = { ...base, toolExecutions: [execution('job-r_call_0', 0, false), ...cleanExecutions(), execution('job-r_call_9', 5)] };
    expect(broken(rerunBeforeRecord)).toEqual({});
    expect(checkInvariants(rerunBeforeRecord).stats).toMatchObject({ toolExecutions: 5, toolExecutionsDelivered: 4, toolCallsRunMoreThanOnce: 1, toolResultsRecorded: 3 });
    expect(broken({ ...base, toolResultsSeen: [seen], toolExecutions: [...cleanExecutions(), execution('job-r_call_9', 0)] })).toEqual({});
  });

  test('chaos: a repeatable call a fenced-out claim runs after a newer claim recorded it is waste, not a repeat', () => {
    const base = clean();
    const claimed = (callId: string, startedAtMs: number, epoch: number, more: Partial<ToolExecution> = {}): ToolExecution => ({
      ...execution(callId, startedAtMs),
      repeatable: true,
      claim: { unit: null, epoch },
      ...more,
    });
    // job-r_call_1 is recorded at 300 µs; claim 2 ran it at 0 ms, before the record.
    const runs = (...later: ToolExecution[]): Observed => ({
      ...base,
      toolExecutions: [execution('job-r_call_0', 0), claimed('job-r_call_1', 0, 2), execution('job-r_call_2', 0), ...later],
    });
    // Clean: claim 1, fenced out by claim 2, ran the repeatable call after the record.
    expect(broken(runs(claimed('job-r_call_1', 1, 1)))).toEqual({});
    expect(checkInvariants(runs(claimed('job-r_call_1', 1, 1))).stats).toMatchObject({ toolRunsByFencedOutClaims: 1, toolExecutionsWithoutClaim: 2 });
    // Violating: the call has an effect (or the toolbox did not say), so the old claim must not run it.
    expect(broken(runs(claimed('job-r_call_1', 1, 1, { repeatable: false })))).toEqual({ toolCallRepeated: 1 });
    const { repeatable: _said, ...notSaid } = claimed('job-r_call_1', 1, 1);
    expect(broken(runs(notSaid))).toEqual({ toolCallRepeated: 1 });
    // Violating: the claim that recorded it, or a newer one, ran it again (recovery produced a recorded result anew).
    expect(broken(runs(claimed('job-r_call_1', 1, 2)))).toEqual({ toolCallRepeated: 1 });
    expect(broken(runs(claimed('job-r_call_1', 1, 3)))).toEqual({ toolCallRepeated: 1 });
    // Violating: an older epoch of another unit is no fenced-out holder of this claim; a run naming no claim cannot be told apart.
    expect(broken(runs(claimed('job-r_call_1', 1, 1, { claim: { unit: 'u1', epoch: 1 } })))).toEqual({ toolCallRepeated: 1 });
    const { claim: _named, ...unnamed } = claimed('job-r_call_1', 1, 1);
    expect(broken(runs(unnamed))).toEqual({ toolCallRepeated: 1 });
    // Violating: the newer claim ran it only after the record, so its run is the repeat (the old claim's is waste beside it).
    const newerAfterRecord: Observed = {
      ...base,
      toolExecutions: [execution('job-r_call_0', 0), claimed('job-r_call_1', 0, 1), execution('job-r_call_2', 0), claimed('job-r_call_1', 2, 2), claimed('job-r_call_1', 3, 1)],
    };
    expect(broken(newerAfterRecord)).toEqual({ toolCallRepeated: 1 });
    expect(checkInvariants(newerAfterRecord).invariants.find((item) => item.name === 'toolCallRepeated')?.violations.map((item) => item.detail)).toEqual([
      'search call job-r_call_1 ran 1 more time(s) after transcript outline~-~outline recorded its result at 300 µs (first at 2000 µs in process 4242, claim job epoch 2; 3 executions in all)',
    ]);
    expect(
      checkInvariants(runs(claimed('job-r_call_1', 1, 2))).invariants.find((item) => item.name === 'toolCallRepeated')?.violations.map((item) => item.detail),
    ).toEqual([
      'search call job-r_call_1 ran 1 more time(s) after transcript outline~-~outline recorded its result at 300 µs (first at 1000 µs in process 4242, claim job epoch 2; 2 executions in all)',
    ]);
  });

  test('chaos: the offline toolbox logs every execution, from any process, when its settings name a file', async () => {
    const directory = await mkdtemp(join(tmpdir(), 'chaos-tool-log-'));
    try {
      const log = join(directory, 'executions.jsonl');
      const toolbox = createCorpusToolbox({ settings: { toolExecutionLog: log, partialToolResultsRate: 1 } });
      const signal = new AbortController().signal;
      await toolbox.execute({ id: 'call_0123456789_0', name: 'search', arguments: JSON.stringify({ query: 'lease' }) }, signal);
      // The second call of a group, interrupted (rate 1): it ran, its result was never delivered.
      await expect(toolbox.execute({ id: 'call_0123456789_1', name: 'read', arguments: JSON.stringify({ id: 'x' }) }, signal)).rejects.toThrow(/interrupted/);
      const { executions, unreadable } = await readToolExecutions(log);
      expect(unreadable).toBe(0);
      expect(executions.map(({ callId, tool, delivered, pid }) => ({ callId, tool, delivered, pid }))).toEqual([
        { callId: 'call_0123456789_0', tool: 'search', delivered: true, pid: process.pid },
        { callId: 'call_0123456789_1', tool: 'read', delivered: false, pid: process.pid },
      ]);
      // Outside a step no claim is named; inside one, its unit (null: the job's own step) and epoch.
      expect(executions.map((execution) => [execution.repeatable, execution.claim])).toEqual([
        [true, undefined],
        [true, undefined],
      ]);
      const tracer = trace.getTracer('chaos-test');
      const inStep = (fields: StepFields) => runInStep(new StepScope(tracer.startSpan('step'), tracer, fields, null), () => toolbox.execute({ id: 'call_0123456789_0', name: 'search', arguments: '{"query":"x"}' }, signal));
      await inStep({ jobId: 'j', unit: 'e1', epoch: 3 });
      await inStep({ jobId: 'j', epoch: 4 });
      await inStep({ jobId: 'j' });
      expect((await readToolExecutions(log)).executions.slice(2).map((execution) => execution.claim)).toEqual([{ unit: 'e1', epoch: 3 }, { unit: null, epoch: 4 }, undefined]);
      // Off by default: nothing is written.
      await createCorpusToolbox({ settings: {} }).execute({ id: 'call_0123456789_0', name: 'search', arguments: '{"query":"x"}' }, signal);
      expect((await readToolExecutions(log)).executions).toHaveLength(5);
      expect((await readToolExecutions(join(directory, 'absent.jsonl'))).executions).toEqual([]);
    } finally {
      await rm(directory, { recursive: true, force: true });
    }
  });
});

describe('chaos: fan-outs, cost, retention stamps and effects, over every job', () => {
  const violationsOf = (observed: Observed, name: InvariantName): string[] =>
    (checkInvariants(observed).invariants.find((invariant) => invariant.name === name)?.violations ?? []).map((violation) => violation.detail);
  /** The research job's record (its cost and last claim's tally as in the clean run) with `overrides`. */
  const researchRecord = (overrides: Partial<JobRecord>): JobRecord => ({ ...(researchJob().record as JobRecord), ...overrides });
  const expertFanOut = { phase: 'expert-content', epoch: 3, units: 1, done: 0, unitIds: ['e1'] };

  test('chaos: a fan-out outliving its claim: still set on a job that left running or was claimed again, or a unit event under a claim that started no fan-out or after it ended', () => {
    // The job document: a fan-out left on a job that is queued again (a release after a unit's quarantine), or claimed since.
    expect(broken(withJob('job-r', (job) => ({ ...job, record: researchRecord({ status: 'queued', fanout: expertFanOut }) })))).toEqual({ fanOutOutlivedClaim: 1 });
    expect(violationsOf(withJob('job-r', (job) => ({ ...job, record: researchRecord({ status: 'running', epoch: 6, fanout: expertFanOut }) })), 'fanOutOutlivedClaim')).toEqual([
      'its fan-out of expert-content (epoch 3) is still set on a running job at epoch 6',
    ]);
    // The timeline: a unit of the old fan-out writes under a newer claim (epoch 6) that started none.
    expect(broken(withJob('job-r', (job) => ({ ...job, events: [...job.events, event(13, 'yielded', 6, 990, 'e1')] })))).toEqual({ fanOutOutlivedClaim: 1 });
    // ... or under the claim that started it, after the join left the job queued.
    const afterJoin = withJob('job-r', (job) => ({
      ...job,
      events: [
        ...job.events.map((item) => (item.kind === 'joined' ? { ...item, status: 'queued' } : item.kind === 'fanned-out' ? { ...item, status: 'running' } : item)),
        { id: unitEventId(820, 'expert-content', 'e1', 1), kind: 'yielded', epoch: 3, unit: 'e1', commitUs: 820, status: 'running' },
      ],
    }));
    expect(violationsOf(afterJoin, 'fanOutOutlivedClaim')).toEqual([expect.stringMatching(/^unit e1's yielded event u-00000000000820.* \(epoch 3\) committed after joined event j00000008 left the job queued$/)]);
    // Clean: units write after their fan-out started and until the commit that ends it (the join's own events included); a running fan-out at its epoch.
    const statuses = withJob('job-r', (job) => ({ ...job, events: job.events.map((item) => (item.kind === 'joined' ? { ...item, status: 'queued' } : item.kind === 'fanned-out' ? { ...item, status: 'running' } : item)) }));
    expect(broken(statuses)).toEqual({});
    expect(violationsOf(withJob('job-r', (job) => ({ ...job, record: researchRecord({ status: 'running', epoch: 3, fanout: expertFanOut }) })), 'fanOutOutlivedClaim')).toEqual([]);
  });

  test("chaos: a job's cost is the sum of its parts: no unit's cost left out once its fan-out ended, none counted twice, the job's at least its units' and its last claim's", () => {
    const withUnits = (unitCosts: CollectedJob['unitCosts'], record?: Partial<JobRecord>): Observed =>
      withJob('job-r', (job) => ({ ...job, unitCosts: [...job.unitCosts, ...unitCosts], ...(record ? { record: researchRecord(record) } : {}) }));
    const e2 = { unit: 'e2', phase: 'expert-content', fanoutEpoch: 3, status: 'queued', cost: { modelCalls: 2, spentUsd: 0.002 }, costInJob: {} };
    // A sibling failed or the owner cancelled: the other unit's spend never reached the job (one violation per counter).
    expect(broken(withUnits([e2]))).toEqual({ costNotSummed: 2 });
    expect(violationsOf(withUnits([e2]), 'costNotSummed')[0]).toBe("unit expert-content~e2 (queued, fan-out epoch 3): modelCalls 2 spent, only 0 reached the job's cost");
    // Counted more than it spent; a job whose cost is below its parts (3 counted from e1 + 2 in its last claim's tally).
    expect(broken(withUnits([{ ...e2, costInJob: { modelCalls: 3, spentUsd: 0.002 } }]))).toEqual({ costNotSummed: 1 });
    expect(violationsOf(withUnits([], { cost: { ...RESEARCH_COST, modelCalls: 4 } }), 'costNotSummed')).toEqual([
      "the job's modelCalls is 4, less than its parts: 5 (its units' counted cost and its last claim's tally)",
    ]);
    // Clean: a unit of the fan-out still running counts later; dollars that differ only in the last bits of their sum.
    expect(violationsOf(withUnits([e2], { status: 'running', fanout: expertFanOut }), 'costNotSummed')).toEqual([]);
    const cents = { unit: 'e2', phase: 'expert-content', fanoutEpoch: 3, status: 'done', cost: { spentUsd: 0.1 + 0.2 }, costInJob: { spentUsd: 0.3 } };
    expect(broken(withUnits([cents], { cost: { ...RESEARCH_COST, spentUsd: 0.3 + 0.003 + 0.002 } }))).toEqual({});
  });

  test('chaos: no expireAt on the documents of a job that has not ended', () => {
    const decision = { reason: 'decision', questionId: 'unknown-effects-1', question: 'Could not check…', options: ['retry the unknown ones'], untilMs: null };
    const waiting = (stamped: string[]): Observed => withJob('job-n', (job) => ({ ...job, job: { ...job.job, status: 'waiting', waiting: decision }, results: [], events: job.events.slice(0, -1), stamped }));
    expect(broken(waiting(['events/j00000001', 'effects/fx_a', '.', 'transcripts/t1']))).toEqual({ expiryOnLiveJob: 1 });
    expect(violationsOf(waiting(['events/j00000001', 'effects/fx_a', '.', 'transcripts/t1']), 'expiryOnLiveJob')).toEqual(['waiting job: 4 document(s) carry expireAt (events/j00000001, effects/fx_a, ., …)']);
    // Clean: the same job unstamped; an ended job stamped by the retention pass.
    expect(broken(waiting([]))).toEqual({});
    expect(broken(withJob('job-r', (job) => ({ ...job, stamped: ['events/j00000001', 'transcripts/outline~-~outline'] })))).toEqual({});
  });

  test('chaos: no effect requested and never sent: a completed job\'s entry the receiver never applied, unless the receiver refused it', () => {
    const base = clean();
    const withoutFxD: ReceiverView = { applications: base.receiver.applications.filter((item) => item.key !== 'fx_d'), requests: base.receiver.requests.filter((item) => item.key !== 'fx_d') };
    const completedWith = (change: Partial<EffectDoc>, receiver: ReceiverView = withoutFxD): Observed => ({
      ...withJob('job-n', (job) => ({ ...job, effects: job.effects.map((item) => (item.key === 'fx_d' ? { ...item, ...change } : item)) })),
      receiver,
    });
    // Left planned, applying or unknown; or written off when the job stopped (a release then completed it).
    for (const state of ['planned', 'applying', 'unknown']) expect(broken(completedWith({ state }))).toEqual({ effectsNeverSent: 1 });
    const writtenOff = completedWith({ state: 'failed', resolution: 'not applied: a stopped job does not retry', lastOutcome: 'not found at the receiver' });
    expect(violationsOf(writtenOff, 'effectsNeverSent')).toEqual(['completed job: record c/c002 (fx_d) is failed (not applied: a stopped job does not retry), and the receiver never applied it']);
    // Clean: refused by the receiver (sent and answered), or given up on, with the reason; stopped by its owner's decision;
    // sent though the ledger lost the answer; a cancelled job's entry never started.
    const refused = 'refused by the receiver (422)';
    expect(broken(completedWith({ state: 'failed', lastOutcome: refused, resolution: refused }, { ...withoutFxD, requests: [...withoutFxD.requests, { op: 'apply', key: 'fx_d', outcome: 422 }] }))).toEqual({});
    expect(broken(completedWith({ state: 'planned', resolution: 'not found at the target; stopped as the owner decided' }))).toEqual({});
    expect(violationsOf(completedWith({ state: 'applying' }, base.receiver), 'effectsNeverSent')).toEqual([]);
    const cancelled: Observed = {
      ...withJob('job-n', (job) => ({
        ...job,
        job: { ...job.job, status: 'cancelled', outcome: null, cancellation: { reason: 'owner', effectsSettled: true } },
        record: jobRecord('job-n', { pipeline: 'notify', status: 'cancelled', outcome: null }),
        results: [],
        events: [...job.events.slice(0, -1), event(5, 'cancelled', 2, 500)],
        checkpoints: job.checkpoints.slice(0, 1),
        effects: job.effects.map((item) => (item.key === 'fx_d' ? { ...item, state: 'planned', commitUs: 450 } : item)),
      })),
      receiver: withoutFxD,
    };
    expect(broken(cancelled)).toEqual({});
    // An item whose send the receiver refused: its record is never logged, by design (the job completes partial, naming it).
    const withoutItem: ReceiverView = {
      applications: base.receiver.applications.filter((item) => item.key !== 'fx_c' && item.key !== 'fx_d'),
      requests: [...base.receiver.requests.filter((item) => item.key !== 'fx_c' && item.key !== 'fx_d'), { op: 'apply', key: 'fx_c', outcome: 422 }],
    };
    const sendRefused = (recordState: string): Observed => ({
      ...withJob('job-n', (job) => ({
        ...job,
        effects: job.effects.map((item) => (item.key === 'fx_c' ? { ...item, state: 'failed', lastOutcome: refused, resolution: refused } : item.key === 'fx_d' ? { ...item, state: recordState } : item)),
      })),
      receiver: withoutItem,
    });
    expect(broken(sendRefused('planned'))).toEqual({});
    // Only a record left planned is explained by its failed send: one left applying or unknown was started, and nobody settled it.
    expect(broken(sendRefused('unknown'))).toEqual({ effectsNeverSent: 1 });
  });
});

describe('chaos: job timelines against the lifecycle table', () => {
  const event = (id: string, status: string, commitUs: number) => ({ id, kind: 'k', epoch: 1, unit: null, commitUs, status });
  test('chaos: a timeline of allowed moves passes; completed → running is a violation naming the move', () => {
    const clean = { id: 'j1', events: [event('j1', 'queued', 1), event('j2', 'running', 2), event('j3', 'queued', 3), event('j4', 'running', 4), event('j5', 'completed', 5)] };
    const broken = { id: 'j2', events: [event('j1', 'queued', 1), event('j2', 'running', 2), event('j3', 'completed', 3), event('j4', 'running', 4)] };
    expect(checkTimelines([clean] as unknown as CollectedJob[])).toEqual([]);
    const violations = checkTimelines([broken] as unknown as CollectedJob[]);
    expect(violations).toHaveLength(1);
    expect(violations[0]?.detail).toMatch(/completed → running/);
  });
});
