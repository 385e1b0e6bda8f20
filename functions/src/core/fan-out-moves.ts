/**
 * The moves a fan-out unit makes on its job, as a table beside core/transitions.ts: each is one
 * pure function returning both records (and the fan-out's other units it charged), which the store
 * commits together. A job leaving its fan-out because of a unit (a quarantine, a failure, a wait)
 * is charged in that same commit what every unit of the fan-out recorded and the job has not
 * counted yet, so no cost is dropped when a fan-out ends early; the units charged are rewritten with
 * their cost marked counted. A unit's finish counts it as done; the last one joins.
 */
import type { FanOutState, JobError, JobRecord, JobStatus, JobWait, UnitRecord, UnitStatus } from './job';
import { chargeUnit, chargeUnits, failJobForUnit, JOB_TRANSITIONS, joinJob, quarantineJobForUnit, TransitionRefused, UNIT_TRANSITIONS, waitJob, type TimelineEvent, type Transition } from './transitions';

interface FanOutMoveRule {
  /** The job's statuses before and after; none: the job is not written. */
  readonly job: { readonly from: readonly JobStatus[]; readonly to: readonly JobStatus[] } | null;
  readonly unit: { readonly from: readonly UnitStatus[]; readonly to: readonly UnitStatus[] };
}

/** Which statuses each move leaves from and goes to, for the job and the unit that makes it. */
export const FAN_OUT_MOVES = {
  /** The unit lost too many workers (its takeover, give-back or expired lease said so): the whole job is quarantined. */
  quarantineViaUnit: { job: JOB_TRANSITIONS.quarantineFromUnit, unit: { from: ['running'], to: ['running', 'queued'] } },
  /** The unit failed for good: the whole job fails; the unit is left queued with its last error. */
  failViaUnit: { job: JOB_TRANSITIONS.failFromUnit, unit: { from: ['running'], to: ['queued'] } },
  /** The unit needs the whole job to wait (a provider outage, the owner's spend cap): it goes back to the queue for the resume. */
  waitViaUnit: { job: JOB_TRANSITIONS.wait, unit: { from: ['running'], to: ['queued'] } },
  /** The unit finished, and units of its fan-out are still out. */
  finish: { job: JOB_TRANSITIONS.renew, unit: UNIT_TRANSITIONS.finish },
  /** The last unit finished: the job joins its fan-out and goes on to its next phase. */
  finishAndJoin: { job: JOB_TRANSITIONS.handOff, unit: UNIT_TRANSITIONS.finish },
  /** An operator's re-drive sets a unit aside: no result, no lease, fresh budgets (store/phase-documents.ts keeps a copy). */
  setAside: { job: null, unit: { from: ['queued', 'running', 'done'], to: ['running'] } },
} as const satisfies Record<string, FanOutMoveRule>;

/** What a unit's move on its job commits: both records, the fan-out's other units it charged, the events. */
export interface FanOutMove {
  readonly job: JobRecord;
  readonly unit: UnitRecord;
  /** Other units of the fan-out whose cost this move counted into the job: rewritten in the same commit. */
  readonly charged: readonly UnitRecord[];
  readonly events: readonly TimelineEvent[];
}

function refuseUnless(rule: FanOutMoveRule, job: JobRecord | null, unit: UnitRecord, what: string): void {
  if (job !== null && rule.job !== null && !rule.job.from.includes(job.status)) throw new TransitionRefused(`Cannot ${what}: the job is ${job.status}`);
  if (!rule.unit.from.includes(unit.status)) throw new TransitionRefused(`Cannot ${what}: the unit is ${unit.status}`);
}

/**
 * The job (as a commit ending `fanout` will write it) charged the cost every unit of that fan-out
 * recorded and the job has not counted, but `except`'s (the unit the commit charges itself).
 * `units`: the fan-out's units as read (other phases' are skipped). Returns the units charged, to rewrite.
 */
export function chargeFanOut(job: JobRecord, fanout: FanOutState | null, units: readonly UnitRecord[], except?: string): { job: JobRecord; charged: UnitRecord[] } {
  if (fanout === null) return { job, charged: [] };
  const siblings = units.filter((unit) => unit.phase === fanout.phase && unit.unit !== except);
  return chargeUnits(job, siblings);
}

/**
 * `unit` ends its job's fan-out (`ended`: the job as the ending transition leaves it, `job`: as
 * read): the job is charged what the unit and every other unit of that fan-out recorded and it has
 * not counted (`others`: the fan-out's units as read).
 */
export function endFanOutViaUnit(job: JobRecord, ended: JobRecord, unit: UnitRecord, others: readonly UnitRecord[]): Omit<FanOutMove, 'events'> {
  const charged = chargeUnit(ended, unit);
  const rest = chargeFanOut(charged.job, job.fanout, others, unit.unit);
  return { job: rest.job, unit: charged.unit, charged: rest.charged };
}

/** running (in a fan-out) → quarantined, by `unit` as its own transition left it (a takeover, a give-back, an expired lease). */
export function quarantineViaUnit(job: JobRecord, unit: Transition<UnitRecord> & { readonly quarantine: string }, others: readonly UnitRecord[], nowMs: number): FanOutMove {
  const quarantined = quarantineJobForUnit(job, { reason: unit.quarantine }, nowMs);
  return { ...endFanOutViaUnit(job, quarantined.next, unit.next, others), events: [...unit.events, ...quarantined.events] };
}

/** running (in a fan-out) → failed: the unit failed for good; it is left queued, without a lease, with its last error. */
export function failViaUnit(
  job: JobRecord,
  unit: UnitRecord,
  others: readonly UnitRecord[],
  input: { readonly reason: string; readonly error: JobError; readonly lastError: UnitRecord['lastError'] },
  nowMs: number,
): FanOutMove {
  refuseUnless(FAN_OUT_MOVES.failViaUnit, job, unit, 'fail a job through its unit');
  const failed = failJobForUnit(job, { reason: input.reason, error: input.error }, nowMs);
  const left: UnitRecord = { ...unit, status: 'queued', lease: null, lastError: input.lastError };
  return { ...endFanOutViaUnit(job, failed.next, left, others), events: failed.events };
}

/** running (in a fan-out) → waiting: the unit needs the job to wait; it goes back to the queue, and the resumed fan-out reuses what is finished. */
export function waitViaUnit(job: JobRecord, unit: UnitRecord, others: readonly UnitRecord[], input: { readonly wait: JobWait; readonly message: string }, nowMs: number): FanOutMove {
  refuseUnless(FAN_OUT_MOVES.waitViaUnit, job, unit, 'make a job wait through its unit');
  const waited = waitJob(job, input.wait, nowMs);
  const left: UnitRecord = { ...unit, status: 'queued', lease: null };
  return { ...endFanOutViaUnit(job, waited.next, left, others), events: [{ kind: 'waiting', message: input.message }] };
}

/** A unit's finish as recorded: both records, and whether it was the fan-out's last unit out (the join is due). */
export interface FinishedUnit {
  readonly job: JobRecord;
  readonly unit: UnitRecord;
  readonly events: readonly TimelineEvent[];
  readonly last: boolean;
}

/** running → done, counted done in the job's fan-out (and its cost in the job's). Refused unless the job is still in the unit's fan-out. */
export function finishUnit(job: JobRecord, unit: UnitRecord, input: { readonly result: unknown; readonly resultVersion: number }): FinishedUnit {
  refuseUnless(FAN_OUT_MOVES.finish, job, unit, 'finish a unit');
  const fanout = job.fanout;
  if (fanout?.epoch !== unit.fanoutEpoch) throw new TransitionRefused(`Job ${job.id} is no longer in fan-out epoch ${unit.fanoutEpoch}`);
  const charged = chargeUnit(job, unit);
  const done = fanout.done + 1;
  return {
    job: { ...charged.job, fanout: { ...fanout, done } },
    unit: { ...charged.unit, status: 'done', lease: null, result: input.result, resultVersion: input.resultVersion },
    events: [{ kind: 'unit-done', message: `${unit.unit} finished` }],
    last: done >= fanout.units,
  };
}

/** The last unit out found `reruns` of its siblings it cannot join (run again first): the fan-out counts them not done. */
export function holdJoinForReruns(finished: FinishedUnit, reruns: number): JobRecord {
  const fanout = finished.job.fanout;
  if (fanout === null) throw new TransitionRefused(`Job ${finished.job.id} has no fan-out to hold`);
  return { ...finished.job, fanout: { ...fanout, done: fanout.done - reruns } };
}

/** The last unit's finish joins the fan-out: the job goes on to `nextPhase` (its checkpoint is the join's, written in the same commit). */
export function joinViaUnit(finished: FinishedUnit, input: { readonly nextPhase: string; readonly message: string }, nowMs: number): Transition<JobRecord> {
  if (!finished.last) throw new TransitionRefused(`Job ${finished.job.id}: units of its fan-out are still out`);
  return joinJob(finished.job, input, nowMs);
}

/** A unit set aside by a re-drive: no result, no lease, fresh budgets, and why, so that the fan-out run again makes it anew. */
export function setAsideUnit(unit: UnitRecord, input: { readonly message: string; readonly atMs: number }): UnitRecord {
  refuseUnless(FAN_OUT_MOVES.setAside, null, unit, 'set a unit aside');
  return { ...unit, status: 'running', lease: null, result: null, attempts: 0, staleReclaims: 0, lastError: { code: 'set-aside', message: input.message, atMs: input.atMs } };
}

/**
 * A unit as a fan-out starts it, from the unit an earlier fan-out of the phase left (`existing`,
 * null: none): done already when its result is `reused` (read by this version, so it is this
 * version's now: `resultVersion`), queued for its next step otherwise. Spent before stays spent and
 * counted: a re-run adds only what it spends itself.
 */
export function startUnit(
  existing: UnitRecord | null,
  input: { readonly jobId: string; readonly phase: string; readonly unit: string; readonly fanoutEpoch: number; readonly reused: { readonly value: unknown } | null; readonly resultVersion: number },
  nowMs: number,
): UnitRecord {
  const { reused } = input;
  return {
    jobId: input.jobId,
    unit: input.unit,
    phase: input.phase,
    fanoutEpoch: input.fanoutEpoch,
    status: reused ? 'done' : 'queued',
    epoch: existing?.epoch ?? 0,
    lease: null,
    step: (existing?.step ?? -1) + 1,
    dispatch: 0,
    attempts: 0,
    staleReclaims: existing?.staleReclaims ?? 0,
    nextRunAtMs: nowMs,
    progress: existing?.progress ?? {},
    cost: existing?.cost ?? {},
    costInJob: existing?.costInJob ?? {},
    claimTally: null,
    result: reused ? reused.value : null,
    // A reused result is this version's now (read as it is, or migrated): the join reads it as such.
    ...(reused ? { resultVersion: input.resultVersion } : {}),
    lastError: null,
    updatedAtMs: nowMs,
  };
}
