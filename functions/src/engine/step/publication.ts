/** The last phase is checkpointed: publish the answer and complete, in one owner-checked commit. */
import { TerminalError, toPhaselineError, type PhaselineError } from '../../core/errors';
import { EMPTY_FLUSH } from '../../core/flusher';
import { completeJob } from '../../core/transitions';
import { type PhaseDefinition } from '../../core/pipeline';
import { unresolvedEffectsOf } from '../../store/effect-access';
import { outboxPublished } from '../../store/job-documents';
import type { ClaimScope } from './claim-scope';
import type { StepOutcome } from './deps';
import { errorDecision, settle, settlingRefusals, type Decision, type JobHolder } from './settle';

/** Completion found ledger entries whose outcome is unknown: a pipeline defect, reported as a terminal failure that names them. */
export class UnresolvedEffectsError extends TerminalError {
  constructor(keys: readonly string[]) {
    super(`Cannot complete while effects are unresolved (applying or unknown): ${keys.join(', ')}; the pipeline must reconcile them before it finishes`);
  }
}

const isUnresolved = (error: unknown): error is PhaselineError => error instanceof UnresolvedEffectsError;

/** The last phase is checkpointed: publish the answer and complete, in one commit conditioned on the job. */
export function complete(scope: ClaimScope<JobHolder>, states: ReadonlyMap<string, unknown>): Promise<StepOutcome> {
  const { pipeline } = scope.work;
  const lastPhase = pipeline.phases[pipeline.phases.length - 1] as PhaseDefinition<unknown, unknown>;
  const context = scope.bareContext({ ...lastPhase, needs: pipeline.phases }, states, 'publication');
  let result;
  try {
    result = pipeline.publish(context);
  } catch (error) {
    return settle(scope, EMPTY_FLUSH, errorDecision(scope, toPhaselineError(error), scope.notes));
  }
  return settle(scope, EMPTY_FLUSH, settlingRefusals(scope, publish(scope, result), isUnresolved, scope.notes));
}

/** One commit conditioned on the job: no transaction locks it while the effects and the outbox are read. */
function publish(scope: ClaimScope<JobHolder>, result: ReturnType<ClaimScope['work']['pipeline']['publish']>): Decision<JobHolder> {
  const { store } = scope.deps;
  const nowMs = store.clock.now();
  return async ({ job }) => {
    // Both read side by side: neither depends on the other, and the commit is conditioned on the job either way.
    const [ledger, outbox] = await Promise.allSettled([unresolvedEffectsOf(store, job.id), outboxPublished(store, job)]);
    // A job cannot complete while an effect's outcome is unknown: the pipeline must reconcile it first (whatever the outbox read did).
    if (ledger.status === 'fulfilled' && ledger.value.length > 0) throw new UnresolvedEffectsError(ledger.value);
    if (ledger.status === 'rejected') throw ledger.reason;
    if (outbox.status === 'rejected') throw outbox.reason;
    const completed = completeJob(job, { outcome: result.outcome, missing: result.missing }, nowMs);
    // The outbox ID is the job's own: an answer already there (a job an operator released after it
    // had published) is kept as it is, never published a second time. Created, not set: an answer
    // that appears after this read fails the commit, which is decided again.
    const published = outbox.value;
    const answer = { jobId: job.id, owner: job.owner, role: 'assistant', pipeline: job.pipeline, outcome: result.outcome, title: result.title, markdown: result.markdown, missing: result.missing, createdAtMs: nowMs };
    return {
      lead: scope.notes,
      next: completed.next,
      events: completed.events,
      documents: published ? [] : [{ kind: 'outbox', document: answer }],
      value: { kind: 'completed', outcome: result.outcome },
    };
  };
}
