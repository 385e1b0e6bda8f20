/**
 * One claim's running state, from its claim to its last commit: the abort controller (a lost claim
 * or a stall stops the work through it), the flusher (progress and the lease heartbeat), the drafts,
 * the spend meter, and the one run-and-stop sequence every phase or unit step goes through.
 */
import { describeError, OwnershipLostError, PhaselineError, SpendLimitReachedError, toPhaselineError } from '../../core/errors';
import { DraftThrottle } from '../../core/draft-throttle';
import { abortedAlready, abortOnLapse, LeaseGuard, LeaseLapsedError } from '../../core/lease-guard';
import { CoalescingFlusher, realTimers, type FlushPayload } from '../../core/flusher';
import type { JobRecord, Lease, UnitRecord } from '../../core/job';
import { budgetWait } from '../../core/lifecycle';
import { holderStopAgeMs } from '../../core/options';
import type { PhaseDefinition, PipelineDefinition, SectionRecord, StepContext, StepLimits } from '../../core/pipeline';
import type { EventDraft } from '../../store/door';
import { writeDraft } from '../../store/drafts';
import { JOB_CLAIM_SLOT, unitClaimSlot } from '../../store/paths';
import { defaultSpendLedger } from '../../store/quota-documents';
import { annotateStep } from '../../telemetry/scope';
import { createStepContext, noDurableWrites, type ContextParts, type DurableWrites } from '../context';
import { StepSpendMeter, stepChargeScope } from '../spend-meter';
import type { RunnerDeps, StepOutcome } from './deps';
import { durableWrites } from './durable-writes';
import { commitTallied, errorDecision, foldTally, giveBackDecision, lost, settle, waitDecision, type Holding, type JobHolder, type UnitHolder } from './settle';

/** The step showed no progress within `progressTimeoutSeconds`: it gives its job back instead of holding it. */
export class NoProgressError extends PhaselineError {
  constructor(message: string) {
    super('internal', true, message);
  }
}

/** Drafts are rewritten at most this often per section, however short the progress interval is set. */
const DRAFT_MIN_INTERVAL_MS = 1_000;

/** What a claim was made on: the records as claimed, and the pipeline this worker runs them with. */
export interface ClaimedWork {
  readonly worker: string;
  readonly pipeline: PipelineDefinition<unknown>;
  readonly input: unknown;
  /** The job as this step claimed it (a unit's: as its claim read it). */
  readonly job: JobRecord;
  /** The unit as claimed, for a unit step. */
  readonly unit: UnitRecord | null;
}

/** How a run ended: its work's result and what the flusher had not written, or already settled (lost, stalled, failed). */
export type Ran<R> = { readonly finished: R; readonly pending: FlushPayload } | { readonly settled: StepOutcome };

/** The parts of a working context that differ per step: the phase, what it starts from, and whether it resumes recorded work. */
export interface WorkParts {
  readonly phase: PhaseDefinition<unknown, unknown>;
  readonly states: ReadonlyMap<string, unknown>;
  readonly sections: SectionRecord[];
  readonly resumed: boolean;
}

export class ClaimScope<H extends JobHolder | UnitHolder = JobHolder | UnitHolder> implements Holding<H> {
  readonly controller = new AbortController();
  /** When the step last showed progress; the heartbeat renews the lease only while this is recent. */
  progressAtMs: number;
  /** The job owner's daily spend cap, for every model call of this step. */
  readonly spend: StepSpendMeter;
  /** The claimed record's lost-worker count: the first section recorded resets it (durable-writes). */
  readonly staleReclaimsAtClaim: number;
  /** Events a job step's settling commit tells first (stored state refused on loading, a resume elsewhere). */
  readonly notes: EventDraft[] = [];
  /** The unit as this holder last wrote it: only its holder writes these fields while it holds the claim. */
  private held: UnitRecord | null;
  /**
   * The last renewal this holder saw committed: past it by holderStopAgeMs (the stale age; a taker
   * waits the clock-skew allowance more), another worker may soon hold the claim, so the calls' signal (every
   * model and tool call's check before it starts) aborts and nothing more starts.
   */
  readonly leaseGuard: LeaseGuard;
  /** The stamp of the renewal this claim began with (the claim itself, or the lease it found). */
  private readonly claimedAtMs: number;
  /**
   * The signal the phase passes to its calls: aborted with the claim's, and on its own once the lease
   * guard lapses. The engine's own writes check the claim's signal alone: the door fences them anyway.
   */
  private readonly calls = new AbortController();

  constructor(
    readonly deps: RunnerDeps,
    readonly holder: H,
    readonly work: ClaimedWork,
  ) {
    const { store } = deps;
    const slot = holder.kind === 'job' ? JOB_CLAIM_SLOT : unitClaimSlot(holder.claim.phase, holder.claim.unit);
    // Names the step's spend charges: unique to this claim, so a charge written again is recognised.
    const chargeScope = stepChargeScope(holder.claim.jobId, slot, holder.claim.epoch);
    this.spend = new StepSpendMeter(deps.spendLedger ?? defaultSpendLedger(store), work.job.owner, store.clock, { chargeScope, ...(deps.log ? { log: deps.log } : {}) });
    this.progressAtMs = store.clock.now();
    this.staleReclaimsAtClaim = work.unit?.staleReclaims ?? work.job.staleReclaims;
    this.held = work.unit;
    const { options, clock } = store;
    const claimed = (holder.kind === 'unit' ? work.unit : work.job)?.lease ?? null;
    const claimedAtMs = claimed === null ? clock.now() : (claimed.renewedAtMs ?? claimed.expiresAtMs - options.leaseSeconds * 1000);
    this.claimedAtMs = claimedAtMs;
    this.leaseGuard = new LeaseGuard(clock, holderStopAgeMs(options), claimedAtMs);
    abortOnLapse(this.calls, () => this.leaseGuard.lapse());
    this.controller.signal.addEventListener('abort', () => this.calls.abort(this.controller.signal.reason), { once: true });
  }

  get jobId(): string {
    return this.holder.claim.jobId;
  }

  get unit(): string | null {
    return this.holder.kind === 'unit' ? this.holder.claim.unit : null;
  }

  /**
   * The one run-and-stop sequence: starts the flusher and drafts, runs `work` with the working
   * context until it settles or the claim is lost (or the step stalls), waits for the writes the work
   * left behind (durable-writes.ts: a section record it did not wait for, a final answer's save; one
   * that failed is the step's failure), stops them, then settles whatever stopped the work (a stall, a
   * lost claim, the owner's spend cap, an error). Only a finished work whose writes all landed comes
   * back for the step to decide on, with what the flusher had not written.
   */
  async run<R>(parts: WorkParts, work: (context: StepContext<unknown>) => Promise<R>): Promise<Ran<R>> {
    const flusher = this.startFlusher();
    const drafts = this.startDrafts(parts.phase.name);
    const durable = durableWrites(this, parts.phase.name, parts.resumed);
    const context = this.workingContext(parts, flusher, drafts, durable);
    let finished: { value: R } | null = null;
    let failure: unknown = null;
    try {
      finished = { value: await untilAborted(work(context), this.controller.signal) };
    } catch (error) {
      failure = error;
    }
    // What the work left behind (its last section records, a final answer's save) is on record before anything is
    // decided from it, and before the flusher's last write, which carries what was reported after it.
    const drained = durable.drain();
    // A lost claim or a stall does not wait for it (its writes are fenced anyway): then nobody else sees its failure.
    drained.catch(() => undefined);
    try {
      await untilAborted(drained, this.controller.signal);
    } catch (error) {
      // A write that failed fails the step, unless the work had failed first (then it is what the step reports).
      if (finished !== null) failure = error;
      finished = null;
    }
    drafts.stop();
    const pending = await flusher.stop();
    await this.spend.settle();
    const { signal } = this.controller;
    // What stopped the work, not a new lapse check: a finished work's commit is fenced by the door in any case.
    const aborted = abortedAlready(signal);
    // The calls stopped on a lapsed lease and the work did not finish.
    const lapse = finished === null && abortedAlready(this.calls.signal) && this.calls.signal.reason instanceof LeaseLapsedError ? this.calls.signal.reason : null;
    if (signal.reason instanceof NoProgressError) {
      this.deps.log?.('step stalled; giving the job back', { reason: signal.reason.message });
      return { settled: await settle(this, pending, giveBackDecision(this, signal.reason.message)) };
    }
    if (lapse !== null && !aborted) {
      // Silent past its stop age, so the step stopped: give the claim back at once, counted as a lost worker as a
      // takeover would count it. Conditioned on the claim like every holder's write: if someone did take over, the door
      // refuses and this is a lost claim; if not, the job is queued with its task now instead of waiting out its lease.
      this.deps.log?.('lease lapsed on this worker; giving the job back', { reason: lapse.message });
      const settled = await settle(this, pending, giveBackDecision(this, lapse.message));
      // Refused: someone did take over. The step's own words say why it stopped.
      return { settled: settled.kind === 'ownership-lost' ? lost(this.deps, lapse) : settled };
    }
    if (aborted || failure instanceof OwnershipLostError) return { settled: lost(this.deps, finished === null ? failure : signal.reason) };
    if (finished !== null) return { finished: finished.value, pending };
    if (failure instanceof SpendLimitReachedError) {
      this.deps.log?.('spend limit reached; the job waits', { spentUsd: failure.spentUsd, capUsd: failure.capUsd });
      const waiting = budgetWait({ message: failure.message, resetAtMs: failure.resetAtMs });
      return { settled: await settle(this, pending, waitDecision(this, waiting, { notes: this.notes, message: `${this.unit ?? ''}: ${failure.message}` })) };
    }
    return { settled: await settle(this, pending, errorDecision(this, toPhaselineError(failure), this.notes)) };
  }

  /** A write the work left behind failed (not a lost claim, which the claim's signal stops): its calls stop, and the step fails with it. */
  stopCalls(reason: unknown): void {
    this.calls.abort(reason);
  }

  freshLease(): Lease {
    const { clock, options } = this.deps.store;
    const nowMs = clock.now();
    return { epoch: this.holder.claim.epoch, worker: this.work.worker, expiresAtMs: nowMs + options.leaseSeconds * 1000, renewedAtMs: nowMs };
  }

  /**
   * The heartbeat's write, gated on progress: a step that showed none within `progressTimeoutSeconds`
   * does not renew its lease; it aborts itself (NoProgressError) and gives the job back.
   */
  private heartbeat(payload: FlushPayload): Promise<void> {
    const { store } = this.deps;
    // Silent past its stop age: someone else may hold the claim, so calls in flight stop too (the renewal is still tried: the door fences it).
    const lapse = this.leaseGuard.lapse();
    if (lapse !== null) this.calls.abort(lapse);
    const idleMs = store.clock.now() - this.progressAtMs;
    if (idleMs > store.options.progressTimeoutSeconds * 1000) {
      this.controller.abort(new NoProgressError(`no progress for ${Math.round(idleMs / 1000)} s (limit ${store.options.progressTimeoutSeconds} s): a call or tool never came back`));
      return Promise.resolve();
    }
    return this.renewLease(payload);
  }

  /** Progress, cost, notes and a fresh lease on the holder's record. A unit's goes through its claim slot alone (no job read), except in a fan-out from before units were listed. */
  private async renewLease(payload: FlushPayload): Promise<void> {
    const { job } = this.work;
    // A fan-out recorded before it listed its units cannot revoke them in the commit that ends it: such a unit's heartbeat reads the job, as before.
    const legacyFanOut = job.fanout !== null && job.fanout.unitIds === undefined;
    if (this.holder.kind === 'job' || this.held === null || legacyFanOut) {
      // The lease of the decision that committed (a lost race decides again, with a later one).
      const renewal: { lease: Lease | null } = { lease: null };
      await commitTallied(this as Holding, payload, (records) => {
        const lease = this.freshLease();
        renewal.lease = lease;
        return 'unit' in records ? { nextUnit: { ...records.unit, lease }, value: undefined } : { next: { ...records.job, lease }, value: undefined };
      });
      if (renewal.lease !== null) this.confirmRenewal(renewal.lease);
      return;
    }
    const { record, notes } = foldTally(this.held, payload, this.holder.claim.epoch);
    const next: UnitRecord = { ...record, lease: this.freshLease(), updatedAtMs: this.deps.store.clock.now() };
    await this.deps.store.apply({ kind: 'slot', holder: this.holder, job }, () => ({ documents: [{ kind: 'unit-flush', unit: next }], events: notes, value: undefined }));
    this.held = next;
    if (next.lease !== null) this.confirmRenewal(next.lease);
  }

  private confirmRenewal(lease: Lease): void {
    this.leaseGuard.confirm(lease.renewedAtMs ?? lease.expiresAtMs - this.deps.store.options.leaseSeconds * 1000);
  }

  /**
   * A unit's lease older than a heartbeat, renewed: its finishing commit can lose to its siblings'
   * job writes for longer than a lease, and the sweeper must never take a live unit's finished work away.
   */
  renewedIfStale(unit: UnitRecord): UnitRecord | null {
    const { clock, options } = this.deps.store;
    const lease = unit.lease;
    if (lease === null) return null;
    const renewedAtMs = lease.renewedAtMs ?? lease.expiresAtMs - options.leaseSeconds * 1000;
    if (clock.now() - renewedAtMs < options.heartbeatSeconds * 1000) return null;
    return { ...unit, lease: this.freshLease() };
  }

  private startFlusher(): CoalescingFlusher {
    const { store } = this.deps;
    const flusher = new CoalescingFlusher((payload) => this.heartbeat(payload), {
      minIntervalMs: store.options.progressFlushMs,
      heartbeatMs: store.options.heartbeatSeconds * 1000,
      // The guard counts the holder's silence from the claim's stamp: so does the first heartbeat.
      renewedAtMs: this.claimedAtMs,
      clock: store.clock,
      ...(this.deps.timers ? { timers: this.deps.timers } : {}),
      onOwnershipLost: (error) => this.controller.abort(error),
      onWriteError: (error) => this.deps.log?.('progress write failed; kept for the next flush', { error: describeError(error) }),
    });
    flusher.start();
    return flusher;
  }

  /** Drafts of this step's sections in flight, paced like progress (never faster than once a second). */
  private startDrafts(phase: string): DraftThrottle {
    const { store } = this.deps;
    const { jobId, unit } = this;
    const epoch = this.holder.claim.epoch;
    return new DraftThrottle((sectionId, text) => writeDraft(store, jobId, { phase, unit, id: sectionId, text, epoch }), {
      minIntervalMs: Math.max(DRAFT_MIN_INTERVAL_MS, store.options.progressFlushMs),
      clock: store.clock,
      timers: this.deps.timers ?? realTimers,
      onWriteError: (error) => this.deps.log?.('draft write failed; the next text replaces it', { error: describeError(error) }),
    });
  }

  /** What every context of this claim shares: the job, the calls' and the claim's signals, clock, randomness and limits. */
  private claimParts() {
    const { store, random } = this.deps;
    return { jobId: this.jobId, input: this.work.input, decisions: this.work.job.decisions, signal: this.calls.signal, claimSignal: this.controller.signal, clock: store.clock, random, limits: stepLimits(store.options) };
  }

  /** The context a working phase or unit runs with: the step's time budget from now, and a progress hook that keeps the lease alive. */
  private workingContext(parts: WorkParts, flusher: CoalescingFlusher, drafts: DraftThrottle, durable: DurableWrites): StepContext<unknown> {
    const { store } = this.deps;
    const budgetMs = store.options.stepBudgetSeconds * 1000;
    // The phase this step works on, for its log lines and spans (telemetry): a new job's claimed record names none yet.
    annotateStep({ phase: parts.phase.name });
    return createStepContext({
      ...this.claimParts(),
      unit: this.unit,
      phase: parts.phase,
      states: parts.states,
      sections: parts.sections,
      flusher,
      drafts,
      durable,
      deadlineMs: store.clock.now() + budgetMs,
      budgetMs,
      spend: this.spend,
      onProgress: () => {
        this.progressAtMs = store.clock.now();
      },
    });
  }

  /** A context for code that runs inside the engine's own commits (units listing, join, publish): no durable writes of its own. */
  bareContext(phase: PhaseDefinition<unknown, unknown>, states: ReadonlyMap<string, unknown>, who: string): StepContext<unknown> {
    const parts: ContextParts<unknown> = {
      ...this.claimParts(),
      unit: null,
      phase,
      states,
      sections: [],
      flusher: null,
      deadlineMs: Number.POSITIVE_INFINITY,
      budgetMs: 0,
      durable: noDurableWrites(who),
    };
    return createStepContext(parts);
  }
}

export function stepLimits(options: { readonly maxServerDelaySeconds: number }): StepLimits {
  return { maxServerDelayMs: options.maxServerDelaySeconds * 1000 };
}

/** Settles with the work, or rejects with the abort reason as soon as the claim is lost or the step stalls. */
export function untilAborted<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason as Error);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason as Error);
    signal.addEventListener('abort', onAbort, { once: true });
    work.then(
      (value) => {
        signal.removeEventListener('abort', onAbort);
        resolve(value);
      },
      (error: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(error instanceof Error ? error : new Error(String(error)));
      },
    );
  });
}
