/**
 * The lifecycle as one table. Every state change of a job or a unit is one pure function
 * `(record, input, nowMs) → { next, events, dispatch? }`: the store commits `next` and `events`
 * in one owner-checked (or re-checked) transaction, then enqueues `dispatch`. Task IDs are
 * computed only here. A transition that does not apply throws `TransitionRefused`, and nothing
 * is written.
 *
 * The moves a job and a unit share as lease holders (claim, take-over, reclaim, give-back,
 * re-dispatch) are written once in lease-holder.ts; their entries here add only what is the
 * job's (its quarantine) or the unit's (its fan-out must be the job's current one).
 *
 * `JOB_TRANSITIONS` / `UNIT_TRANSITIONS` say which status each transition leaves from and goes
 * to: the README's lifecycle diagram is checked against them by a test, and the chaos soak checks
 * every job's committed timeline against `allowedJobMove`.
 */
import { addCounts } from './flusher';
import { stepTaskId, unitTaskId, type Cancellation, type FanOutState, type JobError, type JobOutcome, type JobRecord, type JobStatus, type JobWait, type UnitRecord, type UnitStatus } from './job';
import { holderMoves, iso, nextStep, refuseUnless, TransitionRefused, type ClaimInput, type Dispatch, type HolderKind, type HolderTransition, type TimelineEvent, type Transition } from './lease-holder';
import { BUDGET_RESUME, withRetentionDue, type ErrorDecision } from './lifecycle';

// The table's vocabulary is lease-holder.ts's; named here too, where every caller of the table looks for it.
export { TransitionRefused, type ClaimInput, type Dispatch, type TimelineEvent, type Transition } from './lease-holder';

type Move<TStatus extends string> = { readonly from: readonly TStatus[]; readonly to: readonly TStatus[] };

/** Which job status each transition leaves from and may go to. The README's diagram is checked against this. */
export const JOB_TRANSITIONS = {
  claim: { from: ['queued'], to: ['running'] },
  takeOver: { from: ['running'], to: ['running', 'quarantined'] },
  renew: { from: ['running'], to: ['running'] },
  startFanOut: { from: ['running'], to: ['running', 'queued'] },
  handOff: { from: ['running'], to: ['queued'] },
  settleError: { from: ['running'], to: ['queued', 'waiting', 'failed'] },
  wait: { from: ['running'], to: ['waiting'] },
  complete: { from: ['running'], to: ['completed'] },
  reclaimExpired: { from: ['running'], to: ['queued', 'quarantined'] },
  giveBack: { from: ['running'], to: ['queued', 'quarantined'] },
  redispatch: { from: ['queued'], to: ['queued'] },
  resumeWait: { from: ['waiting'], to: ['queued'] },
  decide: { from: ['waiting'], to: ['queued'] },
  cancel: { from: ['queued', 'running', 'waiting'], to: ['cancelled'] },
  /** A unit of the job's fan-out lost too many workers (a takeover, a give-back or an expired lease said so). */
  quarantineFromUnit: { from: ['running'], to: ['quarantined'] },
  /** A unit of the job's fan-out failed for good. */
  failFromUnit: { from: ['running'], to: ['failed'] },
  release: { from: ['quarantined'], to: ['queued'] },
  /** An operator restarts a job from a named phase (not a cancelled one: its owner stopped it). */
  redrive: { from: ['completed', 'failed', 'quarantined'], to: ['queued'] },
  /**
   * A job whose document the codec refuses is quarantined where it stands, by a write of the few
   * fields the sweeps and readers key on (store/unreadable-jobs.ts): nothing else can be decided from it.
   */
  quarantineUnreadable: { from: ['queued', 'running', 'waiting'], to: ['quarantined'] },
} as const satisfies Record<string, Move<JobStatus>>;

export type JobTransitionName = keyof typeof JOB_TRANSITIONS;

export const UNIT_TRANSITIONS = {
  claim: { from: ['queued'], to: ['running'] },
  takeOver: { from: ['running'], to: ['running'] },
  renew: { from: ['running'], to: ['running'] },
  yield: { from: ['running'], to: ['queued'] },
  settleError: { from: ['running'], to: ['queued'] },
  finish: { from: ['running'], to: ['done'] },
  reclaimExpired: { from: ['running'], to: ['queued'] },
  giveBack: { from: ['running'], to: ['queued'] },
  redispatch: { from: ['queued'], to: ['queued'] },
  park: { from: ['running', 'queued'], to: ['running'] },
  /** A finished unit whose result the join cannot read (an earlier version's, with no migration for it) runs again. */
  rerun: { from: ['done'], to: ['queued'] },
} as const satisfies Record<string, Move<UnitStatus>>;

/** Every (from, to) pair the job table allows, as `from -> to`. */
export function jobMoves(): ReadonlySet<string> {
  const moves = new Set<string>();
  for (const move of Object.values(JOB_TRANSITIONS) as Move<JobStatus>[]) {
    for (const from of move.from) for (const to of move.to) moves.add(`${from} -> ${to}`);
  }
  return moves;
}

/** Whether a job may go from one status to the next in one commit. */
export function allowedJobMove(from: JobStatus, to: JobStatus): boolean {
  return jobMoves().has(`${from} -> ${to}`);
}

// ---- Task IDs: computed here only -----------------------------------------------------------

export function jobDispatch(job: Pick<JobRecord, 'id' | 'step' | 'dispatch'>, delayMs = 0): Dispatch {
  return { task: { jobId: job.id, step: job.step }, id: stepTaskId(job.id, job.step, job.dispatch), delayMs };
}

export function unitDispatch(unit: Pick<UnitRecord, 'jobId' | 'unit' | 'phase' | 'fanoutEpoch' | 'step' | 'dispatch'>, delayMs = 0): Dispatch {
  return { task: { jobId: unit.jobId, step: unit.step, unit: unit.unit, phase: unit.phase }, id: unitTaskId(unit.jobId, unit.fanoutEpoch, unit.unit, unit.step, unit.dispatch), delayMs };
}

/**
 * The job quarantined for `reason`: no lease, and no fan-out left. No fan-out outlives the claim that
 * started it: a release claims the job again under a new epoch, and a unit of the old fan-out must
 * find nothing to belong to (see currentFanOut).
 */
function quarantined(job: JobRecord, reason: string, staleReclaims: number, nowMs: number): JobRecord {
  return { ...job, status: 'quarantined', lease: null, fanout: null, staleReclaims, quarantine: { reason, atMs: nowMs }, finishedAtMs: nowMs };
}

// ---- The job and the unit as lease holders ---------------------------------------------------

const capitalized = (text: string): string => text.charAt(0).toUpperCase() + text.slice(1);

/** A job as a lease holder: past the lost-worker limit it is quarantined, its fan-out ended with it. */
const JOB_HOLDER: HolderKind<JobRecord> = {
  noun: 'job',
  announcesClaims: true,
  event: (_job, kind, text) => ({ kind, message: capitalized(text) }),
  dispatch: jobDispatch,
  dispatchAfterReclaim: () => 0,
  quarantine: (job, reason, staleReclaims, nowMs) => ({ next: quarantined(job, reason, staleReclaims, nowMs), events: [{ kind: 'quarantined', message: `Quarantined: ${reason}` }] }),
};

/**
 * A fan-out unit as a lease holder. Its events go to its job's timeline, named by the unit. Past
 * the lost-worker limit it is the job that is quarantined: the unit lets go of its lease and names
 * the reason (the caller commits the job's quarantine with it).
 */
const UNIT_HOLDER: HolderKind<UnitRecord> = {
  noun: 'unit',
  announcesClaims: false,
  event: (unit, kind, text) => ({ kind, message: `Unit ${unit.unit} ${text}`, unit: unit.unit }),
  dispatch: unitDispatch,
  // Unit task IDs carry the dispatch number: a reclaimed unit takes one never used in this fan-out.
  dispatchAfterReclaim: (unit) => unit.dispatch + 1,
  quarantine: (unit, why, staleReclaims) => {
    const reason = `unit ${unit.unit}: ${why}`;
    return { next: { ...unit, lease: null, staleReclaims }, events: [{ kind: 'quarantined', message: `Quarantined: ${reason}`, unit: unit.unit }], quarantine: reason };
  },
};

const JOB_MOVES = holderMoves(JOB_HOLDER);
const UNIT_MOVES = holderMoves(UNIT_HOLDER);

// ---- Job transitions --------------------------------------------------------------------------

/** queued → running: a new fencing epoch and a lease. */
export const claimJob = JOB_MOVES.claim;

/**
 * running → running (new epoch) or quarantined: a task finds its own step held by a worker whose
 * heartbeat is stale (early reclaim). A fresh heartbeat is refused with the wait until it would be stale.
 */
export const takeOverJob = JOB_MOVES.takeOver;

/** running → queued (or quarantined): the lease expired; found by the sweeper. */
export const reclaimExpiredJob = JOB_MOVES.reclaimExpired;

/** running → queued (or quarantined): the step showed no progress and gives its job back. */
export const giveBackJob = JOB_MOVES.giveBack;

/** queued → queued: its task went missing; a fresh dispatch of the same step. */
export const redispatchJob = JOB_MOVES.redispatch;

export interface HandOffInput {
  /** True when a phase checkpointed: progress, so both budgets start again. */
  readonly checkpointed: boolean;
  readonly nextPhase: string;
  /** The next step is not due before this (a yield that waits for something to settle); now when absent. */
  readonly dueAtMs?: number;
}

/** running → queued at the next step, with that step's task (delayed until the step is due). */
export function handOffJob(job: JobRecord, input: HandOffInput, nowMs: number): Transition<JobRecord> {
  refuseUnless(job, JOB_TRANSITIONS.handOff.from, 'hand off');
  const dueAtMs = Math.max(nowMs, input.dueAtMs ?? nowMs);
  const next: JobRecord = {
    ...nextStep(job, dueAtMs),
    status: 'queued',
    phase: input.nextPhase,
    attempts: input.checkpointed ? 0 : job.attempts,
    staleReclaims: input.checkpointed ? 0 : job.staleReclaims,
  };
  return { next, events: [], dispatch: jobDispatch(next, dueAtMs - nowMs) };
}

/** running → waiting: a decision (no resume time) or a provider outage (resume time). */
export function waitJob(job: JobRecord, wait: JobWait, nowMs: number): Transition<JobRecord> {
  refuseUnless(job, JOB_TRANSITIONS.wait.from, 'wait');
  const next: JobRecord = { ...nextStep(job, wait.untilMs ?? nowMs), status: 'waiting', fanout: null, waiting: wait };
  return { next, events: [{ kind: 'waiting', message: wait.question }] };
}

export interface ErrorInput {
  readonly decision: ErrorDecision;
  readonly error: JobError;
}

/** running → queued (backoff), waiting (a capped outage) or failed (budget spent, or terminal). */
export function settleJobError(job: JobRecord, input: ErrorInput, nowMs: number): Transition<JobRecord> {
  refuseUnless(job, JOB_TRANSITIONS.settleError.from, 'settle an error');
  const { decision, error } = input;
  const base: JobRecord = { ...job, lease: null, attempts: decision.attempts, lastError: error };
  switch (decision.action) {
    case 'requeue': {
      const delayMs = decision.nextRunAtMs - nowMs;
      const next: JobRecord = { ...nextStep(base, decision.nextRunAtMs), status: 'queued' };
      return {
        next,
        events: [{ kind: 'retrying', message: `Attempt ${decision.attempts} failed (${error.code}: ${error.message}); retrying in ${Math.round(delayMs / 1000)} s` }],
        dispatch: jobDispatch(next, delayMs),
      };
    }
    case 'wait': {
      const question = `${error.message}: ${decision.reason}.`;
      const next: JobRecord = { ...nextStep(base, decision.untilMs), status: 'waiting', waiting: { reason: 'provider', questionId: 'provider', question, options: [], untilMs: decision.untilMs } };
      return { next, events: [{ kind: 'waiting', message: question }] };
    }
    case 'fail':
      return {
        next: withRetentionDue(job, { ...base, status: 'failed', fanout: null, finishedAtMs: nowMs }, nowMs),
        events: [{ kind: 'failed', message: `Failed: ${decision.reason}. Last error (${error.code}): ${error.message}` }],
      };
  }
}

/** running → completed: the outbox is written in the same commit by the caller. */
export function completeJob(job: JobRecord, input: { readonly outcome: JobOutcome; readonly missing: readonly string[] }, nowMs: number): Transition<JobRecord> {
  refuseUnless(job, JOB_TRANSITIONS.complete.from, 'complete');
  const summary = input.missing.length > 0 ? `Completed (partial; missing: ${input.missing.join(', ')})` : 'Completed';
  const next: JobRecord = { ...job, status: 'completed', outcome: input.outcome, lease: null, finishedAtMs: nowMs, phase: null };
  return { next: withRetentionDue(job, next, nowMs), events: [{ kind: 'completed', message: summary }] };
}

/**
 * running → running without a lease (units hold theirs), or straight to queued when nothing is
 * left to run (joined in the same commit: a fan-out never sits without a live unit).
 */
export function startFanOutJob(job: JobRecord, input: { readonly fanout: FanOutState; readonly joinedNextPhase: string | null }, nowMs: number): Transition<JobRecord> {
  refuseUnless(job, JOB_TRANSITIONS.startFanOut.from, 'start a fan-out');
  const { fanout } = input;
  const started: JobRecord = { ...job, lease: null, phase: fanout.phase, fanout };
  const events: TimelineEvent[] = [{ kind: 'fanned-out', message: `${fanout.phase}: ${fanout.units} units (${fanout.done} reused)` }];
  if (input.joinedNextPhase === null) return { next: started, events };
  const joined = joinJob(started, { nextPhase: input.joinedNextPhase, message: `${fanout.phase}: nothing left to run; joined at once` }, nowMs);
  return { ...joined, events: [...events, ...joined.events] };
}

/** running (fan-out) → queued at the next step: every unit finished and the phase checkpointed. */
export function joinJob(job: JobRecord, input: { readonly nextPhase: string; readonly message: string }, nowMs: number): Transition<JobRecord> {
  const next: JobRecord = { ...nextStep(job, nowMs), status: 'queued', fanout: null, phase: input.nextPhase, attempts: 0, staleReclaims: 0 };
  return { next, events: [{ kind: 'joined', message: input.message }], dispatch: jobDispatch(next) };
}

/** waiting (provider or budget) → queued: the resume time came. A decision wait never resumes by itself. */
export function resumeWaitJob(job: JobRecord, nowMs: number): Transition<JobRecord> {
  refuseUnless(job, JOB_TRANSITIONS.resumeWait.from, 'resume');
  const wait = job.waiting;
  if (wait === null || wait.reason === 'decision' || wait.untilMs === null) throw new TransitionRefused('the job waits for a person');
  if (wait.untilMs > nowMs) throw new TransitionRefused('the wait was extended since the query');
  const next: JobRecord = { ...nextStep(job, nowMs), status: 'queued', waiting: null };
  const what = wait.reason === 'budget' ? 'The daily spend limit reset' : `The provider wait ended`;
  return { next, events: [{ kind: 'resumed', message: `${what} at ${iso(wait.untilMs)}; resuming at step ${next.step}` }], dispatch: jobDispatch(next) };
}

/**
 * waiting (decision or budget) → queued: the owner answered the question the job asked.
 * Validation of a decision's answer is the caller's. A budget wait is answered only with
 * `resume` (its `cancel` option is the cancel transition): it is not a decision the pipeline
 * reads, so nothing is filed under it, and a job still over its cap waits again at its first call.
 */
export function decideWaitingJob(job: JobRecord, input: { readonly questionId: string; readonly answer: string }, nowMs: number): Transition<JobRecord> {
  const wait = job.waiting;
  if (job.status !== 'waiting' || (wait?.reason !== 'decision' && wait?.reason !== 'budget')) {
    throw new TransitionRefused(`Job ${job.id} is not waiting for a decision (it is ${job.status})`);
  }
  if (wait.questionId !== input.questionId) throw new TransitionRefused(`Job ${job.id} is waiting on question ${wait.questionId}, not ${input.questionId}`);
  if (wait.reason === 'budget') {
    if (input.answer !== BUDGET_RESUME) throw new TransitionRefused(`A spend limit wait is resumed with "${BUDGET_RESUME}", not "${input.answer}"`);
    const next: JobRecord = { ...nextStep(job, nowMs), status: 'queued', waiting: null };
    return { next, events: [{ kind: 'decided', message: `Resumed by its owner at the spend limit (step ${next.step})` }], dispatch: jobDispatch(next) };
  }
  const next: JobRecord = { ...nextStep(job, nowMs), status: 'queued', waiting: null, decisions: { ...job.decisions, [input.questionId]: input.answer } };
  return { next, events: [{ kind: 'decided', message: `${wait.question} → ${input.answer}` }], dispatch: jobDispatch(next) };
}

/** any non-terminal → cancelled; in-flight effects become unknown (the caller's ledger writes) until reconciled. */
export function cancelJobRecord(job: JobRecord, input: { readonly cancellation: Cancellation; readonly message: string; readonly effectsToSettleAtMs: number | null }, nowMs: number): Transition<JobRecord> {
  refuseUnless(job, JOB_TRANSITIONS.cancel.from, 'cancel');
  const next: JobRecord = { ...job, status: 'cancelled', lease: null, fanout: null, waiting: null, finishedAtMs: nowMs, cancellation: input.cancellation, effectsToSettleAtMs: input.effectsToSettleAtMs };
  return {
    next: withRetentionDue(job, next, nowMs),
    events: [{ kind: 'cancelled', message: input.message }],
  };
}

/** quarantined → queued at a new step with fresh budgets: an operator's release (`by` names them when known). */
export function releaseJob(job: JobRecord, nowMs: number, by: string | null = null): Transition<JobRecord> {
  refuseUnless(job, JOB_TRANSITIONS.release.from, 'release');
  // A fan-out a quarantine left on record (before quarantines ended them) ends here: the new claim starts its own.
  const next: JobRecord = { ...nextStep(job, nowMs), status: 'queued', quarantine: null, fanout: null, attempts: 0, staleReclaims: 0, finishedAtMs: null };
  const was = job.quarantine ? ` (it was quarantined because ${job.quarantine.reason})` : '';
  return {
    next,
    events: [{ kind: 'released', message: `Released from quarantine by ${by === null ? 'an operator' : `operator ${by}`}${was}; attempts and stale reclaims reset, resuming at step ${next.step}` }],
    dispatch: jobDispatch(next),
  };
}

export interface RedriveInput {
  readonly fromPhase: string;
  /** Who re-drove it and why, as the operator said. */
  readonly by: string;
  readonly reason: string;
  /** Documents set aside by this re-drive (its commit and the pages before it), and the prefix of their IDs under `setAside`. */
  readonly setAside: number;
  readonly auditPrefix: string;
  /** Where the job resumes: `fromPhase`, or an earlier phase it never finished (stored state decides). */
  readonly resumesAt: string;
}

/**
 * completed, failed or quarantined → queued at a new step: an operator re-drives the job from a
 * phase, whose state (and every later phase's) the same commit set aside. Budgets start fresh, and
 * what ended the job is cleared (outcome, finish time, quarantine, last error, and the retention
 * marker, so the sweeper does not expire the documents of a job that runs again).
 */
export function redriveJobRecord(job: JobRecord, input: RedriveInput, nowMs: number): Transition<JobRecord> {
  refuseUnless(job, JOB_TRANSITIONS.redrive.from, 're-drive');
  const count = (job.redrive?.count ?? 0) + 1;
  const next: JobRecord = {
    ...nextStep(job, nowMs),
    status: 'queued',
    outcome: null,
    phase: input.resumesAt,
    attempts: 0,
    staleReclaims: 0,
    finishedAtMs: null,
    quarantine: null,
    lastError: null,
    waiting: null,
    fanout: null,
    retention: null,
    redrive: { count, fromPhase: input.fromPhase, by: input.by, reason: input.reason, atMs: nowMs, previousStatus: job.status, setAside: input.setAside, auditPrefix: input.auditPrefix },
  };
  const why = job.quarantine?.reason ?? job.lastError?.message;
  const was = job.status === 'completed' || why === undefined ? job.status : `${job.status} (${why})`;
  const resumes = input.resumesAt === input.fromPhase ? '' : `; it resumes at ${input.resumesAt}, an earlier phase it never finished`;
  const message =
    `Re-driven from ${input.fromPhase} by ${input.by}: ${input.reason}. It was ${was}; ${input.setAside} documents of ${input.fromPhase} and later phases ` +
    `set aside for audit (setAside/${input.auditPrefix}…)${resumes}; attempts and stale reclaims reset, resuming at step ${next.step}`;
  return { next, events: [{ kind: 'redriven', message }], dispatch: jobDispatch(next) };
}

// ---- Unit transitions ------------------------------------------------------------------------

/**
 * The fan-out the job is in under the claim that started it, or null. A fan-out is started by a
 * claim and the job's epoch stays that claim's while its units run (no job claim happens meanwhile):
 * a fan-out still on record under a later epoch (a job claimed again since) has ended, whatever the
 * record says, and no unit of it may claim or write again.
 */
export function currentFanOut(job: Pick<JobRecord, 'status' | 'epoch' | 'fanout'>): FanOutState | null {
  return job.status === 'running' && job.fanout !== null && job.fanout.epoch === job.epoch ? job.fanout : null;
}

/** Whether a unit belongs to its job's current fan-out. */
export function inFanOut(job: JobRecord, unit: UnitRecord): boolean {
  return currentFanOut(job)?.epoch === unit.fanoutEpoch;
}

// ---- A fan-out ended by one of its units ------------------------------------------------------

/**
 * Adds the part of a unit's cost the job has not counted yet, and marks it counted on the unit:
 * each unit's cost is counted once, however many commits (a finish, the end of its fan-out, a
 * release) charge it.
 */
export function chargeUnit(job: JobRecord, unit: UnitRecord): { job: JobRecord; unit: UnitRecord } {
  const uncounted: Record<string, number> = {};
  for (const [key, value] of Object.entries(unit.cost)) {
    const counted = unit.costInJob[key] ?? 0;
    if (value > counted) uncounted[key] = value - counted;
  }
  return { job: { ...job, cost: addCounts(job.cost, uncounted) }, unit: { ...unit, costInJob: { ...unit.cost } } };
}

/** Whether part of a unit's recorded cost is not in its job's cost yet. */
export function hasUncountedCost(unit: Pick<UnitRecord, 'cost' | 'costInJob'>): boolean {
  return Object.entries(unit.cost).some(([key, value]) => value > (unit.costInJob[key] ?? 0));
}

/**
 * The commit that ends a fan-out (early: a failure, a wait, a quarantine, a cancel) charges the job
 * what every unit of it recorded and the job has not counted: the units given back are the ones
 * this charged (to be written in that commit), the others need no write.
 */
export function chargeUnits(job: JobRecord, units: readonly UnitRecord[]): { job: JobRecord; charged: UnitRecord[] } {
  let next = job;
  const charged: UnitRecord[] = [];
  for (const unit of units) {
    if (!hasUncountedCost(unit)) continue;
    const result = chargeUnit(next, unit);
    next = result.job;
    charged.push(result.unit);
  }
  return { job: next, charged };
}

/** running (in a fan-out) → quarantined: a unit lost too many workers; the unit's transition names the reason and tells it. */
export function quarantineJobForUnit(job: JobRecord, input: { readonly reason: string }, nowMs: number): Transition<JobRecord> {
  refuseUnless(job, JOB_TRANSITIONS.quarantineFromUnit.from, 'quarantine a job');
  return { next: quarantined(job, input.reason, job.staleReclaims, nowMs), events: [] };
}

/** running (in a fan-out) → failed: a unit failed for good (terminal, or its attempts spent); the fan-out ends with the job. */
export function failJobForUnit(job: JobRecord, input: { readonly reason: string; readonly error: JobError }, nowMs: number): Transition<JobRecord> {
  refuseUnless(job, JOB_TRANSITIONS.failFromUnit.from, 'fail a job');
  const next: JobRecord = { ...job, status: 'failed', fanout: null, lease: null, finishedAtMs: nowMs, lastError: input.error };
  return { next: withRetentionDue(job, next, nowMs), events: [{ kind: 'failed', message: `Failed: ${input.reason}. Last error: ${input.error.message}` }] };
}

/**
 * done → queued at the unit's next step: the join cannot read its result (an earlier version of the
 * phase produced it and declares no migration for it, or it fails its schema), so it runs again.
 */
export function rerunUnit(unit: UnitRecord, input: { readonly why: string }, nowMs: number): Transition<UnitRecord> {
  refuseUnless(unit, UNIT_TRANSITIONS.rerun.from, 'run a unit again');
  const { resultVersion: _unread, ...withoutVersion } = unit;
  const next: UnitRecord = { ...nextStep(withoutVersion, nowMs), status: 'queued', attempts: 0, result: null };
  return { next, events: [{ kind: 'rerun', message: `${unit.unit}: runs again: ${input.why}`, unit: unit.unit }], dispatch: unitDispatch(next) };
}

/** A unit's task may claim or take over only while its job runs the fan-out the unit belongs to. */
function refuseOutsideFanOut(job: JobRecord, unit: UnitRecord): void {
  if (!inFanOut(job, unit)) throw new TransitionRefused(`job is ${job.status}, not in this unit's fan-out`);
}

/** queued → running under the unit's own new epoch; the job must be in this unit's fan-out. */
export function claimUnit(job: JobRecord, unit: UnitRecord, input: ClaimInput, nowMs: number): Transition<UnitRecord> {
  refuseOutsideFanOut(job, unit);
  return UNIT_MOVES.claim(unit, input, nowMs);
}

/** running → running (new epoch): the unit's own step is held by a silent worker. Quarantine is the job's (see the caller). */
export function takeOverUnit(job: JobRecord, unit: UnitRecord, input: ClaimInput, nowMs: number): HolderTransition<UnitRecord> {
  refuseOutsideFanOut(job, unit);
  return UNIT_MOVES.takeOver(unit, input, nowMs);
}

/** running → queued at the unit's next step: more to do, a new task continues. */
export function yieldUnit(unit: UnitRecord, nowMs: number): Transition<UnitRecord> {
  refuseUnless(unit, UNIT_TRANSITIONS.yield.from, 'yield a unit');
  const next: UnitRecord = { ...nextStep(unit, nowMs), status: 'queued' };
  return { next, events: [{ kind: 'yielded', message: `${unit.unit}: continuing in a new step` }], dispatch: unitDispatch(next) };
}

/** running → queued with backoff (or until a capped outage ends). A failure of the whole job is the caller's. */
export function requeueUnit(unit: UnitRecord, input: { readonly attempts: number; readonly untilMs: number; readonly message: string; readonly kind: string; readonly lastError: UnitRecord['lastError'] }, nowMs: number): Transition<UnitRecord> {
  refuseUnless(unit, UNIT_TRANSITIONS.settleError.from, 'requeue a unit');
  const next: UnitRecord = { ...nextStep(unit, input.untilMs), status: 'queued', attempts: input.attempts, lastError: input.lastError };
  return { next, events: [{ kind: input.kind, message: input.message }], dispatch: unitDispatch(next, input.untilMs - nowMs) };
}

/** running → queued (the job is quarantined by the caller when the decision says so): the unit's lease expired. */
export const reclaimExpiredUnit = UNIT_MOVES.reclaimExpired;

/** running → queued (the job is quarantined by the caller when the decision says so): the unit's step showed no progress. */
export const giveBackUnit = UNIT_MOVES.giveBack;

/** queued → queued: the unit's task went missing. */
export const redispatchUnit = UNIT_MOVES.redispatch;

/** A unit of a fan-out that ended: no lease and not queued, so no sweep query matches it again. */
export function parkUnit(unit: UnitRecord, input: { readonly why: string }, nowMs: number): Transition<UnitRecord> {
  return { next: { ...unit, status: 'running', lease: null, lastError: { code: 'parked', message: `Parked by the sweeper: ${input.why}`, atMs: nowMs } }, events: [] };
}

/**
 * Checks a job's committed timeline (the job status each event recorded, in commit order) against
 * the table: every change of status must be a move the table allows. Events of one commit share
 * its status, so only changes are checked. Returns the first disallowed move, or null.
 */
export function firstDisallowedMove(statuses: readonly JobStatus[]): { readonly index: number; readonly from: JobStatus; readonly to: JobStatus } | null {
  for (let index = 1; index < statuses.length; index += 1) {
    const from = statuses[index - 1] as JobStatus;
    const to = statuses[index] as JobStatus;
    if (from !== to && !allowedJobMove(from, to)) return { index, from, to };
  }
  return null;
}
