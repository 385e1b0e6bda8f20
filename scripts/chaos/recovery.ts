/**
 * Recovery per fault kind: the time from a fault to the next DURABLE PROGRESS of the job it hit,
 * read from what the soak collects at the end (commit times of the job's documents). Pure.
 *
 * Durable progress of a job is a commit of its work: a section, a phase checkpoint, a transcript
 * save, an effect ledger entry, a unit event written under a unit's claim, or a job event (a
 * status change, a checkpoint note, a terminal event). The bookkeeping of recovery itself is not
 * progress: `claimed`, `reclaimed` and `redispatched` events are left out.
 *
 * Which progress counts depends on what the fault hit:
 *   - a claim (a worker killed, frozen or fenced by an expired lease; a task lost under a running
 *     step; a commit's answer lost): the first progress committed after the fault in that claim's
 *     scope (the job, or the fan-out unit) by a later claim (a higher epoch in that scope), or the
 *     unit's finish (a `unit-done` event naming it) once the hit claim was reclaimed. The hit claim's
 *     own next progress counts instead when it came before anything showed a later claim of its
 *     scope (the claim was not stopped: an expired lease its owner renewed before the sweeper came,
 *     a commit whose lost answer its worker checked and went on from), except after a fault that
 *     stopped its worker (`HOLDER_STOPPED`: a killed or frozen worker's commit still in flight can
 *     land after the fault, and is not a recovery) or had it reclaimed at once (`stopsHolderByMs`:
 *     the live holder's commit that lands before the reclaim fences it is a leftover too). The job's terminal event counts in every case
 *     (the job moved on without that claim). A later claim the job got long after (once a person
 *     answered its question, say) does not make the hit claim's own progress not count.
 *   - a job, not a claim (a duplicate task, a receiver outage during its send phase, Firestore
 *     stalled or cut while it ran, a commit whose answer was lost): the job's first progress
 *     committed after the fault, by any claim, in any scope.
 * A fault that hit several jobs (Firestore stalled, a rolling deploy) is recovered once each of
 * them has progressed: its figure is the slowest of its targets, and that job is the one named.
 * A fault that hit nothing is not counted, nor a target whose job had ended by the fault's time
 * (cancelled by its owner a moment before: what follows is the stopped job's bookkeeping); a target with no progress after the fault at all (it
 * was already waiting for a person, or the run ended first) is counted apart, as not recovered.
 * Faults overlap: when another fault hit the same job before it recovered, its figure holds that
 * one's delay too. It is counted all the same, and flagged (`overlapped`) so the table can say so.
 *
 * Fault times are this machine's wall clock (the soak's Date.now when the fault took effect);
 * commit times are the Firestore emulator's, read from the same clock on the same machine.
 */
import { TERMINAL, UNIT_EVENT_ID, ownedWrites } from './invariants';
import type { CollectedJob } from './model';

/** What a fault hit: a job, and when a claim was hit, that claim's scope and epoch. */
export interface FaultTarget {
  readonly jobId: string;
  /** The fan-out unit's document key (`{phase}~{unit}`), or null for the job's own claim. */
  readonly unit: string | null;
  /** The hit claim's fencing epoch in that scope; null when the fault hit the job, not a claim. */
  readonly epoch: number | null;
}

export interface FaultRecord {
  /** Its place in the run's sequence of injected faults (1-based), to name it in the report. */
  readonly index: number;
  readonly kind: string;
  /** When it took effect, wall-clock milliseconds. */
  readonly atMs: number;
  readonly targets: readonly FaultTarget[];
  /**
   * A fault that has the hit claim reclaimed while its worker lives on (an expired lease and the
   * sweep the fault runs at once): when a reclaim of that claim commits by this time (wall-clock
   * ms), its worker counts as stopped, as after HOLDER_STOPPED faults. A commit of the worker's
   * that lands between the fault and that reclaim is a leftover the reclaim fenced out.
   */
  readonly stopsHolderByMs?: number;
}

/** One commit of a job's work. */
export interface ProgressMark {
  /** null: the job's own scope; otherwise a unit's document key. */
  readonly scope: string | null;
  readonly epoch: number;
  readonly commitUs: number;
  readonly what: string;
  readonly terminal: boolean;
  /** A `unit-done` event: the unit it names (a job event, written by whichever claim finished the unit). */
  readonly finishedUnit?: string;
}

/** Events that record recovery bookkeeping, not progress. */
const BOOKKEEPING_EVENTS: ReadonlySet<string> = new Set(['claimed', 'reclaimed', 'redispatched']);

/** Faults that stop the hit claim's worker (SIGKILL, SIGSTOP): its own commits after them are leftovers in flight. */
export const HOLDER_STOPPED: ReadonlySet<string> = new Set(['worker-kill', 'worker-freeze', 'task-loss']);

/** Every commit of a job's work, in commit order. */
export function progressMarks(job: CollectedJob): ProgressMark[] {
  const marks: ProgressMark[] = [];
  for (const write of ownedWrites(job)) {
    // Unit events come with the job's events below.
    if (write.collection === 'events') continue;
    marks.push({ scope: write.unit, epoch: write.epoch, commitUs: write.commitUs, what: `${write.collection}/${write.id}`, terminal: false });
  }
  for (const event of job.events) {
    if (BOOKKEEPING_EVENTS.has(event.kind)) continue;
    const unit = UNIT_EVENT_ID.exec(event.id);
    const scope = unit?.[1] !== undefined && unit[2] !== undefined ? `${unit[1]}~${unit[2]}` : null;
    const epoch = unit?.[3] !== undefined ? Number(unit[3]) : event.epoch;
    const finishedUnit = unit === null && event.kind === 'unit-done' && event.unit !== null ? { finishedUnit: event.unit } : {};
    marks.push({ scope, epoch, commitUs: event.commitUs, what: `events/${event.id} (${event.kind})`, terminal: TERMINAL.has(event.kind), ...finishedUnit });
  }
  return marks.filter((mark) => Number.isFinite(mark.commitUs)).sort((a, b) => a.commitUs - b.commitUs);
}

/** The unit name of a unit scope key (`{phase}~{unit}`). */
const unitName = (scope: string): string => scope.slice(scope.indexOf('~') + 1);

/**
 * When something first showed a claim of `scope` later than `epoch`, at or after `fromUs`: a write at
 * a higher epoch, the job's claimed event (job scope), a unit event from a higher unit epoch, or a
 * reclaim of the claim (the job's `reclaimed` event at that epoch; for a unit, a `reclaimed` event
 * naming it, which carries the job's epoch, not the unit's). Infinity when nothing did.
 */
function supersededAtUs(job: CollectedJob, marks: readonly ProgressMark[], scope: string | null, epoch: number, fromUs: number): number {
  const times: number[] = marks.filter((mark) => mark.scope === scope && mark.epoch > epoch).map((mark) => mark.commitUs);
  times.push(reclaimedAtUs(job, scope, epoch, fromUs));
  for (const event of job.events) {
    if (event.commitUs < fromUs) continue;
    const unit = UNIT_EVENT_ID.exec(event.id);
    if (scope === null) {
      if (unit === null && event.kind === 'claimed' && event.epoch > epoch) times.push(event.commitUs);
    } else if (unit !== null && `${unit[1] ?? ''}~${unit[2] ?? ''}` === scope && Number(unit[3]) > epoch) {
      times.push(event.commitUs);
    }
  }
  return times.filter((time) => time >= fromUs).reduce((first, time) => Math.min(first, time), Number.POSITIVE_INFINITY);
}

/**
 * When the claim of `scope` at `epoch` was first reclaimed at or after `fromUs` (Infinity: not
 * seen): for the job, its `reclaimed` event at that epoch; for a unit, a `reclaimed` event under
 * the unit's own claim at that unit epoch, or a job event naming the unit (it carries the job's
 * epoch, not the unit's).
 */
function reclaimedAtUs(job: CollectedJob, scope: string | null, epoch: number, fromUs: number): number {
  let first = Number.POSITIVE_INFINITY;
  for (const event of job.events) {
    if (event.kind !== 'reclaimed' || event.commitUs < fromUs || event.commitUs >= first) continue;
    const unit = UNIT_EVENT_ID.exec(event.id);
    const reclaimsIt =
      scope === null
        ? unit === null && event.epoch === epoch
        : unit !== null
          ? `${unit[1] ?? ''}~${unit[2] ?? ''}` === scope && Number(unit[3]) === epoch
          : event.unit === unitName(scope);
    if (reclaimsIt) first = event.commitUs;
  }
  return first;
}

/** Whether the fault stopped the hit claim's worker: by its kind, or by the reclaim it brought about in time. */
function holderStopped(fault: FaultRecord, job: CollectedJob, target: FaultTarget): boolean {
  if (HOLDER_STOPPED.has(fault.kind)) return true;
  if (fault.stopsHolderByMs === undefined || target.epoch === null) return false;
  return reclaimedAtUs(job, target.unit, target.epoch, fault.atMs * 1000) <= fault.stopsHolderByMs * 1000;
}

/**
 * The first progress of `target`'s job that counts as its recovery from a fault at `atMs`, or null.
 * `holderStopped`: the fault stopped the hit claim's worker (see HOLDER_STOPPED).
 */
export function progressAfter(job: CollectedJob, target: FaultTarget, atMs: number, holderStopped = true): ProgressMark | null {
  const marks = progressMarks(job);
  const fromUs = atMs * 1000;
  const after = marks.filter((mark) => mark.commitUs > fromUs);
  if (target.epoch === null) return after[0] ?? null;
  const { epoch, unit } = target;
  const supersededUs = supersededAtUs(job, marks, unit, epoch, fromUs);
  const finishes = (mark: ProgressMark): boolean => unit !== null && mark.finishedUnit === unitName(unit) && mark.commitUs > supersededUs;
  return (
    after.find((mark) => {
      if (mark.terminal || finishes(mark)) return true;
      if (mark.scope !== unit) return false;
      if (mark.epoch > epoch) return true;
      // The hit claim's own work: it was not stopped, unless its worker was or a later claim showed first.
      return mark.epoch === epoch && (supersededUs === Number.POSITIVE_INFINITY || (!holderStopped && mark.commitUs < supersededUs));
    }) ?? null
  );
}

export interface Recovered {
  readonly fault: FaultRecord;
  readonly jobId: string;
  readonly ms: number;
  readonly what: string;
  /** Another fault hit the same job after this one and before this recovery. */
  readonly overlapped: boolean;
  /**
   * How long the job was parked in a wait between the fault and this recovery (a provider's
   * cool-down, a person's answer): no claim of it may run then, so `ms` holds that wait too.
   */
  readonly waitedMs: number;
  /**
   * For a hit claim that another took over: how long after the fault something first showed that
   * (a reclaim, or a later claim's work or event in its scope); the rest of `ms` is the new claim
   * getting going. Null when the hit claim went on itself, or the fault hit the job, not a claim.
   */
  readonly detectedMs: number | null;
}

/** When, after a fault at `atMs`, something first showed a later claim of the hit claim's scope, at or before `progressUs`; null if nothing did by then. */
export function supersededAfter(job: CollectedJob, target: FaultTarget, atMs: number, progressUs: number): number | null {
  if (target.epoch === null) return null;
  const supersededUs = supersededAtUs(job, progressMarks(job), target.unit, target.epoch, atMs * 1000);
  return supersededUs <= progressUs ? supersededUs / 1000 - atMs : null;
}

export interface KindRecovery {
  readonly kind: string;
  /** One per fault that hit something and whose every target progressed again. */
  readonly recovered: readonly Recovered[];
  /** Faults with a target that never progressed after them. */
  readonly notRecovered: readonly { readonly fault: FaultRecord; readonly jobId: string }[];
}

/**
 * The nearest-rank percentile: the smallest value with at least p % of the values at or below it.
 * Over 1 to 99 values the p99 is the worst.
 */
export function percentile(sortedValues: readonly number[], p: number): number {
  if (sortedValues.length === 0) return Number.NaN;
  const rank = Math.max(1, Math.ceil((p / 100) * sortedValues.length));
  return sortedValues[Math.min(rank, sortedValues.length) - 1] ?? Number.NaN;
}

/** Recovery per fault kind, in the order the kinds are given (kinds with no fault counted are left out). */
export function recoveryByKind(faults: readonly FaultRecord[], jobs: readonly CollectedJob[], kinds: readonly string[]): KindRecovery[] {
  const byId = new Map(jobs.map((job) => [job.id, job]));
  const out: KindRecovery[] = [];
  for (const kind of kinds) {
    const recovered: Recovered[] = [];
    const notRecovered: { fault: FaultRecord; jobId: string }[] = [];
    for (const fault of faults.filter((item) => item.kind === kind && item.targets.length > 0)) {
      let slowest: Recovered | null = null;
      let missing: string | null = null;
      for (const target of fault.targets) {
        const job = byId.get(target.jobId);
        // A job that had ended by then (its owner cancelled it a moment before) had nothing left to recover.
        if (job !== undefined && endedBy(job, fault.atMs)) continue;
        const mark = job ? progressAfter(job, target, fault.atMs, holderStopped(fault, job, target)) : null;
        if (job === undefined || mark === null) {
          missing ??= target.jobId;
          continue;
        }
        const ms = mark.commitUs / 1000 - fault.atMs;
        if (slowest === null || ms > slowest.ms) {
          const waitedMs = waitedBetween(job, fault.atMs * 1000, mark.commitUs) / 1000;
          slowest = { fault, jobId: target.jobId, ms, what: mark.what, overlapped: false, waitedMs, detectedMs: supersededAfter(job, target, fault.atMs, mark.commitUs) };
        }
      }
      if (missing !== null) notRecovered.push({ fault, jobId: missing });
      else if (slowest !== null) recovered.push({ ...slowest, overlapped: overlaps(faults, fault, slowest.jobId, fault.atMs + slowest.ms) });
    }
    if (recovered.length > 0 || notRecovered.length > 0) out.push({ kind, recovered: recovered.sort((a, b) => a.ms - b.ms), notRecovered });
  }
  return out;
}

/** Whether the job's terminal event committed at or before `atMs`. */
function endedBy(job: CollectedJob, atMs: number): boolean {
  return job.events.some((event) => TERMINAL.has(event.kind) && event.commitUs <= atMs * 1000);
}

/**
 * How long (µs) the job was waiting within (`fromUs`, `untilUs`): parked from an event that left it
 * waiting (the job's status as of that event's commit) to the next event that did not. An event
 * that names no status ends a wait: what is not known to be a wait is not taken out of a figure.
 */
export function waitedBetween(job: CollectedJob, fromUs: number, untilUs: number): number {
  const events = [...job.events].sort((a, b) => a.commitUs - b.commitUs);
  let waitedUs = 0;
  let parkedSinceUs: number | null = null;
  const close = (endUs: number): void => {
    if (parkedSinceUs !== null) waitedUs += Math.max(0, Math.min(endUs, untilUs) - Math.max(parkedSinceUs, fromUs));
    parkedSinceUs = null;
  };
  for (const event of events) {
    if (event.commitUs >= untilUs) break;
    if (event.status === 'waiting') parkedSinceUs ??= event.commitUs;
    else close(event.commitUs);
  }
  close(untilUs);
  return waitedUs;
}

/** Whether a fault other than `fault` hit `jobId` after it and before `untilMs`. */
function overlaps(faults: readonly FaultRecord[], fault: FaultRecord, jobId: string, untilMs: number): boolean {
  return faults.some((other) => other !== fault && other.atMs >= fault.atMs && other.atMs < untilMs && other.targets.some((target) => target.jobId === jobId));
}

export interface KindFigures {
  readonly kind: string;
  readonly n: number;
  readonly p50Ms: number;
  readonly p95Ms: number;
  readonly p99Ms: number;
  readonly worstMs: number;
  /** The job and the fault (its index in the run) of the worst. */
  readonly worst: { readonly jobId: string; readonly fault: number; readonly what: string } | null;
  readonly notRecovered: number;
  /** Recoveries during which another fault hit the same job (their figure holds its delay too). */
  readonly overlapped: number;
  /** Recoveries during which the job was parked in a wait (their figure holds the wait too). */
  readonly held: number;
  /** The p99 over the recoveries no other fault overlapped, each less the time its job was parked in a wait: this kind's own cost, apart from compounding faults and waits. */
  readonly aloneP99Ms: number;
  /** Recoveries in which another claim took the hit one over, and over them: fault to take-over, and take-over to progress (p50, p99). */
  readonly takenOver: number;
  readonly detectP50Ms: number;
  readonly detectP99Ms: number;
  readonly resumeP50Ms: number;
  readonly resumeP99Ms: number;
}

export function figures(recovery: KindRecovery): KindFigures {
  const values = recovery.recovered.map((item) => item.ms);
  const worst = recovery.recovered.at(-1) ?? null;
  const takeOvers = recovery.recovered.filter((item): item is Recovered & { detectedMs: number } => item.detectedMs !== null);
  const sorted = (list: number[]): number[] => list.sort((a, b) => a - b);
  const detected = sorted(takeOvers.map((item) => item.detectedMs));
  const resumed = sorted(takeOvers.map((item) => item.ms - item.detectedMs));
  return {
    kind: recovery.kind,
    n: values.length,
    p50Ms: percentile(values, 50),
    p95Ms: percentile(values, 95),
    p99Ms: percentile(values, 99),
    worstMs: worst?.ms ?? Number.NaN,
    worst: worst && { jobId: worst.jobId, fault: worst.fault.index, what: worst.what },
    notRecovered: recovery.notRecovered.length,
    overlapped: recovery.recovered.filter((item) => item.overlapped).length,
    held: recovery.recovered.filter((item) => item.waitedMs > 0).length,
    aloneP99Ms: percentile(
      sorted(recovery.recovered.filter((item) => !item.overlapped).map((item) => item.ms - item.waitedMs)),
      99,
    ),
    takenOver: detected.length,
    detectP50Ms: percentile(detected, 50),
    detectP99Ms: percentile(detected, 99),
    resumeP50Ms: percentile(resumed, 50),
    resumeP99Ms: percentile(resumed, 99),
  };
}

const seconds = (ms: number): string => (Number.isFinite(ms) ? (ms / 1000).toFixed(1) : '—');
const pad = (text: string, width: number): string => (text.length >= width ? text : text + ' '.repeat(width - text.length));
const padLeft = (text: string, width: number): string => (text.length >= width ? text : ' '.repeat(width - text.length) + text);

/** The report's table: one row per kind, seconds. */
export function formatRecovery(rows: readonly KindFigures[]): string[] {
  const lines = [`${pad('Recovery: fault to next durable progress (s)', 46)}${['n', 'p50', 'p95', 'p99', 'worst', 'none', 'ovl', 'wait', 'alone'].map((head) => padLeft(head, 7)).join('')}  worst: job (fault #)`];
  if (rows.length === 0) lines.push('  (no fault hit a job)');
  for (const row of rows) {
    const cells = [String(row.n), seconds(row.p50Ms), seconds(row.p95Ms), seconds(row.p99Ms), seconds(row.worstMs), String(row.notRecovered), String(row.overlapped), String(row.held), seconds(row.aloneP99Ms)];
    lines.push(`  ${pad(row.kind, 44)}${cells.map((cell) => padLeft(cell, 7)).join('')}  ${row.worst ? `${row.worst.jobId} (#${row.worst.fault})` : ''}`);
  }
  const takeOvers = rows.filter((row) => row.takenOver > 0);
  if (takeOvers.length === 0) return lines;
  lines.push('', `${pad('Taken over: fault to take-over, then on (s)', 46)}${['n', 'tk p50', 'tk p99', 'then50', 'then99'].map((head) => padLeft(head, 7)).join('')}`);
  for (const row of takeOvers) {
    const cells = [String(row.takenOver), seconds(row.detectP50Ms), seconds(row.detectP99Ms), seconds(row.resumeP50Ms), seconds(row.resumeP99Ms)];
    lines.push(`  ${pad(row.kind, 44)}${cells.map((cell) => padLeft(cell, 7)).join('')}`);
  }
  return lines;
}
