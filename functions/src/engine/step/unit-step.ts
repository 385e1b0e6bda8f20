/** One unit step: claim (or take over) a fan-out unit, run it under its own lease, and record its outcome. */
import { z } from 'zod';
import { OwnershipLostError, SpendLimitReachedError, TerminalError, toPhaselineError } from '../../core/errors';
import { applyClaimTally, EMPTY_FLUSH } from '../../core/flusher';
import { type JobRecord, type JobWait, type StepTask } from '../../core/job';
import { waitRecord } from '../../core/lifecycle';
import { claimUnit, quarantineJobForUnit, takeOverUnit, TransitionRefused, yieldUnit, type Transition } from '../../core/transitions';
import { encodeUnitFlush, type UnitRecord } from '../../store/codec';
import type { UnitClaim } from '../../core/claims';
import type { JobStore } from '../../store/job-store';
import { unitClaimSlot } from '../../store/paths';
import { stepChargeScope } from '../spend-meter';
import { loadCheckpoints, loadSections, NewerVersionError } from '../checkpoints';
import { endFanOutFromUnit } from '../ended-fan-out';
import { durableWrites } from './durable-writes';
import { JoinFailedError, finishUnit } from './fan-out';
import { NoProgressError, RunnerDeps, Running, StepOutcome, defaultWorkerName, dispatchQuietly, freshLease, lost, newRunning, progressGated, startDrafts, startFlusher, untilAborted, workingContext } from './running';
import { failJobFromUnit, giveBack, settleUnitError, waitAtSpendLimit, waitJobFromUnit } from './settle';

export async function runUnitStep(deps: RunnerDeps, task: StepTask, unitId: string, phaseName: string): Promise<StepOutcome> {
  const { store } = deps;
  const worker = deps.worker ?? defaultWorkerName();
  const nowMs = store.clock.now();
  type UnitClaimResult = { job: JobRecord; unit: UnitRecord } | { reason: string; notYetDueMs?: number };
  let claimed: UnitClaimResult;
  let slotUpdateTime: Parameters<JobStore['unitSession']>[1];
  try {
    // Read, decide, then one commit conditioned on the unit and its claim slot (and the job when it is written): no transaction, no lock on the job.
    ({ value: claimed, slotUpdateTime } = await store.commitUnitChange<UnitClaimResult>({ jobId: task.jobId, phase: phaseName, unit: unitId }, async ({ tx, job, unit }) => {
      const input = { step: task.step, worker, options: store.options };
      let claim: Transition<UnitRecord> & { readonly quarantine?: string };
      try {
        // A queued unit is claimed; this task's own unit step still held after a crash is taken over once its holder went silent.
        claim = unit.status === 'running' && unit.step === task.step ? takeOverUnit(job, unit, input, nowMs) : claimUnit(job, unit, input, nowMs);
      } catch (error) {
        if (!(error instanceof TransitionRefused)) throw error;
        return { value: error.notYetDueMs === undefined ? { reason: error.message } : { reason: error.message, notYetDueMs: error.notYetDueMs } };
      }
      if (claim.quarantine !== undefined) {
        const ended = await endFanOutFromUnit(store, tx, job, claim.next, quarantineJobForUnit(job, { reason: claim.quarantine }, nowMs).next);
        return { ...ended, events: claim.events, value: { reason: `job quarantined: ${claim.quarantine}` } };
      }
      // A takeover is told on the job's timeline; a plain claim stays off the hot job document.
      const told = claim.events.length > 0 ? { next: job, events: claim.events } : {};
      return { nextUnit: claim.next, ...told, value: { job, unit: claim.next } };
    }));
  } catch (error) {
    if (!(error instanceof OwnershipLostError)) throw error;
    return { kind: 'not-claimable', reason: 'no such job or unit' };
  }
  if (!('unit' in claimed)) {
    if (claimed.notYetDueMs !== undefined) return { kind: 'not-yet-due', retryAfterMs: claimed.notYetDueMs };
    return { kind: 'not-claimable', reason: claimed.reason };
  }
  const { job, unit } = claimed;
  const claim: UnitClaim = { jobId: job.id, phase: unit.phase, unit: unit.unit, epoch: unit.epoch, fanoutEpoch: unit.fanoutEpoch };
  const pipeline = deps.pipelines.get(job.pipeline);
  const phase = pipeline?.phases.find((candidate) => candidate.name === unit.phase);
  const input = pipeline?.input.safeParse(job.input);
  const running: Running | null = pipeline && input?.success ? newRunning(deps, worker, pipeline, input.data, { owner: job.owner, decisions: job.decisions, staleReclaims: unit.staleReclaims }, stepChargeScope(job.id, unitClaimSlot(unit.phase, unit.unit), unit.epoch)) : null;
  if (!running || !phase?.fanOut) {
    return failJobFromUnit(deps, claim, new TerminalError(`Unit ${unit.unit}: pipeline ${job.pipeline} has no fan-out phase ${unit.phase}, or the stored input no longer validates`));
  }
  const fanOut = phase.fanOut;
  const startedOn = job.pipelineVersion ?? 1;
  if (startedOn > (running.pipeline.version ?? 1)) {
    return settleUnitError(deps, claim, new NewerVersionError(`Job ${job.id} started on version ${startedOn} of ${running.pipeline.name}; this worker runs version ${running.pipeline.version ?? 1} and leaves it to a newer one`), EMPTY_FLUSH);
  }
  // Side by side: both read after the claim landed, and neither needs the other.
  const sectionsRead = loadSections(store, job.id, phase, unit.unit);
  sectionsRead.catch(() => undefined);
  const loaded = await loadCheckpoints(store, job.id, running.pipeline);
  if (loaded.unreadable) return settleUnitError(deps, claim, loaded.unreadable, EMPTY_FLUSH);
  const sections = await sectionsRead;
  // One owner-write path for the whole step: heartbeats, progress, sections and transcripts share the slot's update time.
  const session = store.unitSession(claim, slotUpdateTime);
  /** The unit as this holder last wrote it: only its holder writes these fields while it holds the claim. */
  let held: UnitRecord = unit;
  // A fan-out recorded before it listed its units cannot revoke them in the commit that ends it: such a unit's heartbeat reads the job, as before.
  const legacyFanOut = job.fanout !== null && job.fanout.unitIds === undefined;
  const flusher = startFlusher(running, progressGated(running, async (payload) => {
    if (legacyFanOut) {
      await store.asUnitOwner(claim, ({ unit: current }) => {
        const applied = applyClaimTally(current, payload, claim.epoch);
        return Promise.resolve({ nextUnit: { ...applied.next, lease: freshLease(running, claim.epoch) }, events: applied.notes, value: undefined });
      });
      return;
    }
    const applied = applyClaimTally(held, payload, claim.epoch);
    const next: UnitRecord = { ...applied.next, lease: freshLease(running, claim.epoch), updatedAtMs: store.clock.now() };
    // Named once per flush, outside the batch: a commit the session repeats after a lost answer sets the same events again.
    const events = store.unitEventDocuments(job, next, applied.notes);
    await session.commit('heartbeat', (batch) => {
      batch.update(store.unitRef(claim.jobId, claim.phase, claim.unit), encodeUnitFlush(next));
      for (const { ref, data } of events) batch.set(ref, data);
    });
    held = next;
  }));
  const drafts = startDrafts(running, job.id, phase.name, unit.unit, claim.epoch);
  const context = workingContext(running, {
    jobId: job.id,
    unit: unit.unit,
    phase,
    states: loaded.states,
    sections: sections.sections,
    flusher,
    drafts,
    durable: durableWrites(running, { kind: 'unit', claim }, session, phase.name, unit.unit, sections.sections.length + sections.refused.length > 0),
  });

  let outcome: Awaited<ReturnType<typeof fanOut.runUnit>>;
  try {
    outcome = await untilAborted(fanOut.runUnit(context, unit.unit), running.controller.signal);
  } catch (error) {
    drafts.stop();
    const pending = await flusher.stop();
    await running.spend.settle();
    if (running.controller.signal.reason instanceof NoProgressError) return giveBack(running, { kind: 'unit', claim }, running.controller.signal.reason, pending);
    if (running.controller.signal.aborted || error instanceof OwnershipLostError) return lost(running, error);
    if (error instanceof SpendLimitReachedError) return waitAtSpendLimit(running, { kind: 'unit', claim }, error, pending, []);
    return settleUnitError(deps, claim, toPhaselineError(error), pending);
  }
  drafts.stop();
  const pending = await flusher.stop();
  await running.spend.settle();
  if (running.controller.signal.reason instanceof NoProgressError) return giveBack(running, { kind: 'unit', claim }, running.controller.signal.reason, pending);
  if (running.controller.signal.aborted) return lost(running, running.controller.signal.reason);

  try {
    if (outcome.kind === 'yield') {
      const yielded = await store.commitAsUnitOwner(claim, ({ unit: current }) => {
        const applied = applyClaimTally(current, pending, claim.epoch);
        const transition = yieldUnit(applied.next, store.clock.now());
        return Promise.resolve({ nextUnit: transition.next, events: [...applied.notes, ...transition.events], value: transition.dispatch });
      });
      await dispatchQuietly(deps, yielded);
      return { kind: 'unit-yielded', unit: unit.unit };
    }
    if (outcome.kind === 'wait') {
      let waiting: JobWait;
      try {
        waiting = waitRecord({ kind: 'wait', reason: 'provider', questionId: 'provider', question: outcome.question, untilMs: outcome.untilMs });
      } catch (error) {
        return await settleUnitError(deps, claim, toPhaselineError(error), pending);
      }
      await waitJobFromUnit(deps, claim, waiting, pending, `${unit.unit}: ${outcome.question}`);
      return { kind: 'waiting', reason: outcome.reason };
    }
    const parsed = fanOut.unitState.safeParse(outcome.state);
    if (!parsed.success) {
      return await failJobFromUnit(deps, claim, new TerminalError(`Unit ${unit.unit} produced a result that fails its schema: ${z.prettifyError(parsed.error)}`));
    }
    const finished = await finishUnit(running, claim, phase, pending, parsed.data);
    return { kind: 'unit-done', unit: unit.unit, joined: finished.joined };
  } catch (error) {
    if (error instanceof OwnershipLostError) return lost(running, error);
    if (error instanceof JoinFailedError) return failJobFromUnit(deps, claim, error);
    // A sibling's result a later version produced: this unit (whose finish joins) is left for a worker of that version.
    if (error instanceof NewerVersionError) return settleUnitError(deps, claim, error, pending);
    throw error;
  }
}
