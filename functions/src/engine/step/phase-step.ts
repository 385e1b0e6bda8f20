/** One phase step: run the phase in the claim's scope, then decide what its outcome makes durable (checkpoint and hand-off, yield, wait). */
import { z } from 'zod';
import { TerminalError, toPhaselineError } from '../../core/errors';
import { type JobWait } from '../../core/job';
import { waitRecord } from '../../core/lifecycle';
import { handOffJob } from '../../core/transitions';
import { type PhaseDefinition, type PhaseOutcome } from '../../core/pipeline';
import type { EventDraft } from '../../store/door';
import { checkpointDocumentFor, loadSections } from '../checkpoints';
import type { ClaimScope } from './claim-scope';
import type { StepOutcome } from './deps';
import { errorDecision, settle, waitDecision, type Decision, type JobHolder } from './settle';

export async function runPhase(scope: ClaimScope<JobHolder>, phase: PhaseDefinition<unknown, unknown>, index: number, states: ReadonlyMap<string, unknown>): Promise<StepOutcome> {
  const { store } = scope.deps;
  const loaded = await loadSections(store, scope.jobId, phase, null);
  for (const refusal of loaded.refused) scope.notes.push({ kind: 'section-refused', message: `Section ${refusal.id} of ${phase.name} failed validation and will be redone: ${refusal.reason}` });
  const ran = await scope.run({ phase, states, sections: loaded.sections, resumed: loaded.sections.length + loaded.refused.length > 0 }, (context) => (phase.run as NonNullable<typeof phase.run>)(context));
  if ('settled' in ran) return ran.settled;
  return settle(scope, ran.pending, decideOutcome(scope, phase, index, ran.finished, loaded.sections.length));
}

/** What the phase's outcome makes durable. */
function decideOutcome(scope: ClaimScope<JobHolder>, phase: PhaseDefinition<unknown, unknown>, index: number, outcome: PhaseOutcome<unknown>, sections: number): Decision<JobHolder> {
  switch (outcome.kind) {
    case 'done': {
      const parsed = phase.state.safeParse(outcome.state);
      if (!parsed.success) return errorDecision(scope, new TerminalError(`Phase ${phase.name} produced a checkpoint that fails its schema: ${z.prettifyError(parsed.error)}`), scope.notes);
      return handOff(scope, [{ kind: 'checkpointed', message: `Finished ${phase.name}` }], {
        checkpoint: { phase, state: parsed.data },
        nextPhase: scope.work.pipeline.phases[index + 1]?.name ?? phase.name,
      }, { kind: 'handed-off', phase: phase.name, checkpointed: true });
    }
    case 'yield': {
      const due = outcome.untilMs === undefined ? '' : ` from ${new Date(outcome.untilMs).toISOString()}`;
      return handOff(scope, [{ kind: 'yielded', message: `${phase.name}: ${sections} sections recorded; continuing in a new step${due}` }], {
        nextPhase: phase.name,
        ...(outcome.untilMs === undefined ? {} : { dueAtMs: outcome.untilMs }),
      }, { kind: 'handed-off', phase: phase.name, checkpointed: false });
    }
    case 'wait': {
      let waiting: JobWait;
      try {
        waiting = waitRecord(outcome);
      } catch (error) {
        return errorDecision(scope, toPhaselineError(error), scope.notes);
      }
      return waitDecision(scope, waiting, { notes: scope.notes, message: waiting.question });
    }
  }
}

export interface HandOff {
  readonly checkpoint?: { readonly phase: PhaseDefinition<unknown, unknown>; readonly state: unknown };
  readonly nextPhase: string;
  readonly dueAtMs?: number;
}

/**
 * Ends this step: optional checkpoint, job back to queued for the next step, and that step's task.
 * The step's notes come before the flusher's, `trail` after them.
 */
function handOff(scope: ClaimScope<JobHolder>, trail: readonly EventDraft[], to: HandOff, outcome: StepOutcome): Decision<JobHolder> {
  const nowMs = scope.deps.store.clock.now();
  const { epoch } = scope.holder.claim;
  return ({ job }) => {
    const transition = handOffJob(job, { checkpointed: to.checkpoint !== undefined, nextPhase: to.nextPhase, ...(to.dueAtMs === undefined ? {} : { dueAtMs: to.dueAtMs }) }, nowMs);
    const { checkpoint } = to;
    return {
      lead: scope.notes,
      next: transition.next,
      events: [...trail, ...transition.events],
      documents: checkpoint ? [{ kind: 'checkpoint', phase: checkpoint.phase.name, document: checkpointDocumentFor(checkpoint.phase, checkpoint.state, epoch, nowMs) }] : [],
      dispatch: transition.dispatch,
      value: outcome,
    };
  };
}
