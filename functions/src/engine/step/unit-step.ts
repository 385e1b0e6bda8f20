/** One unit step: run a claimed fan-out unit in its claim's scope, then decide what its outcome makes durable (yield, a wait of the whole job, its finish). */
import { z } from 'zod';
import { TerminalError, toPhaselineError } from '../../core/errors';
import { EMPTY_FLUSH } from '../../core/flusher';
import { type JobWait } from '../../core/job';
import { waitRecord } from '../../core/lifecycle';
import { yieldUnit } from '../../core/transitions';
import { type PhaseDefinition } from '../../core/pipeline';
import { loadCheckpoints, loadSections } from '../checkpoints';
import type { ClaimScope } from './claim-scope';
import type { StepOutcome } from './deps';
import { finish } from './fan-out';
import { errorDecision, settle, waitDecision, type Decision, type UnitHolder } from './settle';

export async function runUnit(scope: ClaimScope<UnitHolder>, phase: PhaseDefinition<unknown, unknown>): Promise<StepOutcome> {
  const { store } = scope.deps;
  const { claim } = scope.holder;
  const fanOut = phase.fanOut;
  if (!fanOut) throw new Error(`Phase ${phase.name} has no fan-out`);
  // Side by side: both read after the claim landed, and neither needs the other.
  const sectionsRead = loadSections(store, claim.jobId, phase, claim.unit);
  sectionsRead.catch(() => undefined);
  const loaded = await loadCheckpoints(store, claim.jobId, scope.work.pipeline);
  if (loaded.unreadable) return settle(scope, EMPTY_FLUSH, errorDecision(scope, loaded.unreadable));
  const sections = await sectionsRead;
  const ran = await scope.run({ phase, states: loaded.states, sections: sections.sections, resumed: sections.sections.length + sections.refused.length > 0 }, (context) => fanOut.runUnit(context, claim.unit));
  if ('settled' in ran) return ran.settled;
  const outcome = ran.finished;
  switch (outcome.kind) {
    case 'yield':
      return settle(scope, ran.pending, yielded(scope));
    case 'wait': {
      let waiting: JobWait;
      try {
        waiting = waitRecord({ kind: 'wait', reason: 'provider', questionId: 'provider', question: outcome.question, untilMs: outcome.untilMs });
      } catch (error) {
        return settle(scope, ran.pending, errorDecision(scope, toPhaselineError(error)));
      }
      return settle(scope, ran.pending, waitDecision(scope, waiting, { message: `${claim.unit}: ${outcome.question}`, reason: outcome.reason }));
    }
    case 'done': {
      const parsed = fanOut.unitState.safeParse(outcome.state);
      if (!parsed.success) return settle(scope, ran.pending, errorDecision(scope, new TerminalError(`Unit ${claim.unit} produced a result that fails its schema: ${z.prettifyError(parsed.error)}`)));
      return finish(scope, phase, ran.pending, parsed.data);
    }
  }
}

/** More to do: the unit goes back to the queue at its next step, and a new task continues it. */
function yielded(scope: ClaimScope<UnitHolder>): Decision<UnitHolder> {
  const nowMs = scope.deps.store.clock.now();
  return ({ unit }) => {
    const transition = yieldUnit(unit, nowMs);
    return { nextUnit: transition.next, events: transition.events, dispatch: transition.dispatch, value: { kind: 'unit-yielded', unit: unit.unit } };
  };
}
