/** One phase step: run the phase with its context, then make its outcome durable (checkpoint and hand-off, yield, wait). */
import { z } from 'zod';
import { OwnershipLostError, SpendLimitReachedError, TerminalError, toPhaselineError } from '../../core/errors';
import { applyClaimTally, type FlushPayload } from '../../core/flusher';
import { type JobWait } from '../../core/job';
import { waitRecord } from '../../core/lifecycle';
import { handOffJob, waitJob } from '../../core/transitions';
import { type PhaseDefinition } from '../../core/pipeline';
import type { JobClaim } from '../../core/claims';
import type { EventDraft } from '../../store/door';
import { checkpointDocumentFor, loadSections } from '../checkpoints';
import { durableWrites } from './durable-writes';
import { NoProgressError, Running, StepOutcome, freshLease, lost, progressGated, startDrafts, startFlusher, untilAborted, workingContext } from './running';
import { giveBack, settleError, waitAtSpendLimit } from './settle';

export async function runPhase(
  running: Running,
  claim: JobClaim,
  phase: PhaseDefinition<unknown, unknown>,
  index: number,
  states: ReadonlyMap<string, unknown>,
  notes: EventDraft[],
): Promise<StepOutcome> {
  const { store } = running.deps;
  const loaded = await loadSections(store, claim.jobId, phase, null);
  for (const refusal of loaded.refused) notes.push({ kind: 'section-refused', message: `Section ${refusal.id} of ${phase.name} failed validation and will be redone: ${refusal.reason}` });

  const flusher = startFlusher(running, progressGated(running, (payload) =>
    store.asOwner(claim, ({ job }) => {
      const applied = applyClaimTally(job, payload, claim.epoch);
      return Promise.resolve({ next: { ...applied.next, lease: freshLease(running, claim.epoch) }, events: applied.notes, value: undefined });
    }),
  ));
  const drafts = startDrafts(running, claim.jobId, phase.name, null, claim.epoch);
  const context = workingContext(running, {
    jobId: claim.jobId,
    unit: null,
    phase,
    states,
    sections: loaded.sections,
    flusher,
    drafts,
    durable: durableWrites(running, { kind: 'job', claim }, store.jobSession(claim), phase.name, null, loaded.sections.length + loaded.refused.length > 0),
  });

  let outcome: Awaited<ReturnType<NonNullable<typeof phase.run>>>;
  try {
    outcome = await untilAborted((phase.run as NonNullable<typeof phase.run>)(context), running.controller.signal);
  } catch (error) {
    drafts.stop();
    const pending = await flusher.stop();
    await running.spend.settle();
    if (running.controller.signal.reason instanceof NoProgressError) return giveBack(running, { kind: 'job', claim }, running.controller.signal.reason, pending);
    if (running.controller.signal.aborted || error instanceof OwnershipLostError) return lost(running, error);
    if (error instanceof SpendLimitReachedError) return waitAtSpendLimit(running, { kind: 'job', claim }, error, pending, notes);
    return settleError(running.deps, claim, toPhaselineError(error), pending, notes);
  }
  drafts.stop();
  const pending = await flusher.stop();
  await running.spend.settle();
  if (running.controller.signal.reason instanceof NoProgressError) return giveBack(running, { kind: 'job', claim }, running.controller.signal.reason, pending);
  if (running.controller.signal.aborted) return lost(running, running.controller.signal.reason);

  try {
    switch (outcome.kind) {
      case 'done': {
        const parsed = phase.state.safeParse(outcome.state);
        if (!parsed.success) {
          return await settleError(running.deps, claim, new TerminalError(`Phase ${phase.name} produced a checkpoint that fails its schema: ${z.prettifyError(parsed.error)}`), pending, notes);
        }
        const nextPhase = running.pipeline.phases[index + 1];
        await handOff(running, claim, pending, notes, [{ kind: 'checkpointed', message: `Finished ${phase.name}` }], {
          checkpoint: { phase, state: parsed.data },
          nextPhase: nextPhase?.name ?? phase.name,
        });
        return { kind: 'handed-off', phase: phase.name, checkpointed: true };
      }
      case 'yield': {
        const due = outcome.untilMs === undefined ? '' : ` from ${new Date(outcome.untilMs).toISOString()}`;
        await handOff(running, claim, pending, notes, [{ kind: 'yielded', message: `${phase.name}: ${context.sections().length} sections recorded; continuing in a new step${due}` }], {
          nextPhase: phase.name,
          ...(outcome.untilMs === undefined ? {} : { dueAtMs: outcome.untilMs }),
        });
        return { kind: 'handed-off', phase: phase.name, checkpointed: false };
      }
      case 'wait': {
        let waiting: JobWait;
        try {
          waiting = waitRecord(outcome);
        } catch (error) {
          return await settleError(running.deps, claim, toPhaselineError(error), pending, notes);
        }
        const nowMs = store.clock.now();
        await store.asOwner(claim, ({ job }) => {
          const applied = applyClaimTally(job, pending, claim.epoch);
          const transition = waitJob(applied.next, waiting, nowMs);
          return Promise.resolve({ next: transition.next, events: [...notes, ...applied.notes, ...transition.events], value: undefined });
        });
        return { kind: 'waiting', reason: waiting.reason };
      }
    }
  } catch (error) {
    if (error instanceof OwnershipLostError) return lost(running, error);
    throw error;
  }
}

export interface HandOff {
  readonly checkpoint?: { readonly phase: PhaseDefinition<unknown, unknown>; readonly state: unknown };
  readonly nextPhase: string;
  readonly dueAtMs?: number;
}

/**
 * Ends this step: optional checkpoint, job back to queued for the next step, and that step's task.
 * `lead` events come before the flusher's notes, `trail` after them.
 */
export async function handOff(running: Running, claim: JobClaim, pending: FlushPayload, lead: readonly EventDraft[], trail: readonly EventDraft[], handOffTo: HandOff): Promise<void> {
  const { store } = running.deps;
  const nowMs = store.clock.now();
  await store.apply({ kind: 'job', claim }, ({ job }) => {
    const applied = applyClaimTally(job, pending, claim.epoch);
    const transition = handOffJob(applied.next, { checkpointed: handOffTo.checkpoint !== undefined, nextPhase: handOffTo.nextPhase, ...(handOffTo.dueAtMs === undefined ? {} : { dueAtMs: handOffTo.dueAtMs }) }, nowMs);
    const { checkpoint } = handOffTo;
    return {
      next: transition.next,
      events: [...lead, ...applied.notes, ...trail, ...transition.events],
      documents: checkpoint ? [{ kind: 'checkpoint', phase: checkpoint.phase.name, document: checkpointDocumentFor(checkpoint.phase, checkpoint.state, claim.epoch, nowMs) }] : [],
      dispatch: transition.dispatch,
      value: undefined,
    };
  });
}
