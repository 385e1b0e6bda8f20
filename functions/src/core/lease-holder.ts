/**
 * The moves every lease holder makes, a job and a fan-out unit alike, written once: claim, take
 * over (a redelivered task finds its step held by a silent worker), reclaim (the sweeper finds an
 * expired lease), give back (a step that made no progress) and re-dispatch (a task that went
 * missing). Each is a pure function of the holder's claim fields (`LeaseHolder`); what differs
 * between a job and a unit — its task, how the timeline names it, what losing one worker too many
 * does — comes from its `HolderKind`, and the named entries in transitions.ts add what is only the
 * job's or only the unit's (a job's quarantine, a unit's fan-out check).
 *
 * Also the vocabulary of the lifecycle table: a transition is `(record, input, nowMs) → { next,
 * events, dispatch? }`, and one that does not apply throws `TransitionRefused`.
 */
import { OwnershipLostError } from './errors';
import type { Lease, LeaseHolder, StepTask } from './job';
import { decideClaim, decideExpiredLease, decideStaleTakeover } from './lifecycle';
import type { EngineOptions } from './options';

export interface TimelineEvent {
  readonly kind: string;
  readonly message: string;
  readonly unit?: string;
}

/** A task to enqueue once the transition has committed. */
export interface Dispatch {
  readonly task: StepTask;
  readonly id: string;
  readonly delayMs: number;
}

export interface Transition<TRecord> {
  readonly next: TRecord;
  readonly events: readonly TimelineEvent[];
  readonly dispatch?: Dispatch;
}

/**
 * A move that may find its holder past the lost-worker limit. A job is quarantined in `next`; a
 * unit cannot quarantine its job itself, so it names the job's quarantine reason here for its caller.
 */
export interface HolderTransition<TRecord> extends Transition<TRecord> {
  readonly quarantine?: string;
}

/** The transition does not apply to the record as it stands. `notYetDueMs`: ask again that much later. */
export class TransitionRefused extends OwnershipLostError {
  constructor(
    message: string,
    readonly notYetDueMs?: number,
  ) {
    super(message);
  }
}

export function refuseUnless(record: { readonly status: string }, allowed: readonly string[], what: string): void {
  if (!allowed.includes(record.status)) throw new TransitionRefused(`Cannot ${what}: the record is ${record.status}`);
}

/** What a move needs to know about the kind of holder it moves. */
export interface HolderKind<T extends LeaseHolder> {
  /** How refusals name it. */
  readonly noun: 'job' | 'unit';
  /**
   * Whether the timeline records each claim: a job's claims are told; a unit's are not (its events
   * go to its job's timeline, where its take-overs, reclaims and what it did are told).
   */
  readonly announcesClaims: boolean;
  /** A timeline event about the holder; `text` reads after the holder's name ("reclaimed at step 3"). */
  event(holder: T, kind: string, text: string): TimelineEvent;
  dispatch(holder: T, delayMs?: number): Dispatch;
  /** The dispatch number of the step a reclaim requeues it at. */
  dispatchAfterReclaim(holder: T): number;
  /** The holder past its lost-worker limit, for `reason`, having counted `staleReclaims`. */
  quarantine(holder: T, reason: string, staleReclaims: number, nowMs: number): HolderTransition<T>;
}

export const iso = (ms: number): string => new Date(ms).toISOString();

function lease(epoch: number, worker: string, nowMs: number, options: EngineOptions): Lease {
  return { epoch, worker, expiresAtMs: nowMs + options.leaseSeconds * 1000, renewedAtMs: nowMs };
}

/** The record back in the queue at its next step, due at `atMs`. */
export function nextStep<T extends Pick<LeaseHolder, 'step' | 'dispatch' | 'nextRunAtMs' | 'lease'>>(record: T, atMs: number): T {
  return { ...record, lease: null, step: record.step + 1, dispatch: 0, nextRunAtMs: atMs };
}

/** The epoch of the claim a record says is held, or null (no worker holds it: not running, or running without a lease). */
export function heldEpoch(holder: Pick<LeaseHolder, 'status' | 'lease'>): number | null {
  return holder.status === 'running' && holder.lease !== null ? holder.lease.epoch : null;
}

export interface ClaimInput {
  readonly step: number;
  readonly worker: string;
  readonly options: EngineOptions;
}

function claimed<T extends LeaseHolder>(kind: HolderKind<T>, holder: T, worker: string, epoch: number): TimelineEvent[] {
  return kind.announcesClaims ? [kind.event(holder, 'claimed', `claimed by ${worker} (epoch ${epoch})`)] : [];
}

/** queued → running at the task's step, once due: a new fencing epoch and a lease. */
export function claim<T extends LeaseHolder>(kind: HolderKind<T>, holder: T, input: ClaimInput, nowMs: number): Transition<T> {
  const decision = decideClaim(holder, input.step, nowMs, kind.noun);
  if (!decision.claimable) throw new TransitionRefused(decision.reason, decision.notYetDueMs);
  const epoch = holder.epoch + 1;
  return { next: { ...holder, status: 'running', epoch, lease: lease(epoch, input.worker, nowMs, input.options) }, events: claimed(kind, holder, input.worker, epoch) };
}

/**
 * running → running under a new epoch (or the holder's quarantine): a task finds its own step held
 * by a worker whose heartbeat is stale (early reclaim). A fresh heartbeat is refused with the wait
 * until it would be stale.
 */
export function takeOver<T extends LeaseHolder>(kind: HolderKind<T>, holder: T, input: ClaimInput, nowMs: number): HolderTransition<T> {
  const { noun } = kind;
  if (holder.status !== 'running' || holder.step !== input.step) throw new TransitionRefused(`${noun} is ${holder.status} at step ${holder.step}`);
  const decision = decideStaleTakeover(holder, nowMs, input.options);
  if (decision === null) throw new TransitionRefused(`${noun} is running without a lease: no worker holds it`);
  if (decision.action === 'redeliver-later') throw new TransitionRefused(`${noun} is running: ${decision.reason}`, decision.retryAfterMs);
  if (decision.action === 'quarantine') return kind.quarantine(holder, decision.reason, decision.staleReclaims, nowMs);
  const epoch = holder.epoch + 1;
  return {
    next: { ...holder, epoch, staleReclaims: decision.staleReclaims, lease: lease(epoch, input.worker, nowMs, input.options) },
    events: [kind.event(holder, 'reclaimed', `reclaimed at step ${holder.step}: ${decision.reason}`), ...claimed(kind, holder, input.worker, epoch)],
  };
}

/** running → queued at the next step (or the holder's quarantine): the sweeper found its lease expired. */
export function reclaimExpired<T extends LeaseHolder>(kind: HolderKind<T>, holder: T, options: EngineOptions, nowMs: number): HolderTransition<T> {
  const held = holder.lease;
  if (holder.status !== 'running' || held === null) throw new TransitionRefused(`the ${kind.noun} changed since the query: it is ${holder.status}${held ? '' : ' without a lease'}`);
  if (held.expiresAtMs > nowMs) throw new TransitionRefused('the lease was extended since the query');
  const decision = decideExpiredLease(holder, options);
  if (decision.action === 'quarantine') return kind.quarantine(holder, decision.reason, decision.staleReclaims, nowMs);
  const next: T = { ...holder, status: 'queued', lease: null, staleReclaims: decision.staleReclaims, step: holder.step + 1, dispatch: kind.dispatchAfterReclaim(holder), nextRunAtMs: nowMs };
  const text =
    `requeued at step ${next.step}: the lease of epoch ${held.epoch} held by ${held.worker} expired at ${iso(held.expiresAtMs)} ` +
    `(stale reclaim ${decision.staleReclaims} of at most ${options.maxStaleReclaims})`;
  return { next, events: [kind.event(holder, 'reclaimed', text)], dispatch: kind.dispatch(next) };
}

export interface GiveBackInput {
  /** What the step saw (it made no progress): the timeline and a quarantine name it. */
  readonly why: string;
  readonly options: EngineOptions;
}

/** running → queued at the next step (or the holder's quarantine): the step showed no progress and gives its holder back, a lost worker. */
export function giveBack<T extends LeaseHolder>(kind: HolderKind<T>, holder: T, input: GiveBackInput, nowMs: number): HolderTransition<T> {
  refuseUnless(holder, ['running'], `give a ${kind.noun} back`);
  const decision = decideExpiredLease(holder, input.options);
  if (decision.action === 'quarantine') return kind.quarantine(holder, `${decision.reason} (last: ${input.why})`, decision.staleReclaims, nowMs);
  const next: T = { ...nextStep(holder, nowMs), status: 'queued', staleReclaims: decision.staleReclaims };
  const text = `given back at step ${holder.step}: ${input.why} (lost worker ${decision.staleReclaims} of at most ${input.options.maxStaleReclaims})`;
  return { next, events: [kind.event(holder, 'reclaimed', text)], dispatch: kind.dispatch(next) };
}

export interface RedispatchInput {
  /** A step due before this and still queued lost its task. */
  readonly lostBeforeMs: number;
}

/** queued → queued: no task claimed the step since it was due; a fresh dispatch of the same step. */
export function redispatch<T extends LeaseHolder>(kind: HolderKind<T>, holder: T, input: RedispatchInput, nowMs: number): Transition<T> {
  refuseUnless(holder, ['queued'], `re-dispatch a ${kind.noun}`);
  if (holder.nextRunAtMs > input.lostBeforeMs) throw new TransitionRefused(`the ${kind.noun} is not overdue any more`);
  const next: T = { ...holder, dispatch: holder.dispatch + 1, nextRunAtMs: nowMs };
  const text = `dispatched again (dispatch ${next.dispatch}): no task claimed step ${holder.step} since ${iso(holder.nextRunAtMs)}`;
  return { next, events: [kind.event(holder, 'redispatched', text)], dispatch: kind.dispatch(next) };
}

/** The five moves bound to one kind of holder: transitions.ts names them as the job's and the unit's entries. */
export function holderMoves<T extends LeaseHolder>(kind: HolderKind<T>) {
  return {
    claim: (holder: T, input: ClaimInput, nowMs: number): Transition<T> => claim(kind, holder, input, nowMs),
    takeOver: (holder: T, input: ClaimInput, nowMs: number): HolderTransition<T> => takeOver(kind, holder, input, nowMs),
    reclaimExpired: (holder: T, options: EngineOptions, nowMs: number): HolderTransition<T> => reclaimExpired(kind, holder, options, nowMs),
    giveBack: (holder: T, input: GiveBackInput, nowMs: number): HolderTransition<T> => giveBack(kind, holder, input, nowMs),
    redispatch: (holder: T, input: RedispatchInput, nowMs: number): Transition<T> => redispatch(kind, holder, input, nowMs),
  };
}
