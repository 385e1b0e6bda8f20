/** The last phase is checkpointed: publish the answer and complete, in one owner-checked commit. */
import { OwnershipLostError, TerminalError, toPhaselineError } from '../../core/errors';
import { EMPTY_FLUSH } from '../../core/flusher';
import { completeJob } from '../../core/transitions';
import { type PhaseDefinition } from '../../core/pipeline';
import type { JobClaim } from '../../core/claims';
import type { EventDraft } from '../../store/door';
import { unresolvedEffectsOf } from '../../store/effect-access';
import { outboxPublished } from '../../store/job-documents';
import { Running, StepOutcome, bareContext, lost } from './running';
import { settleError } from './settle';

/** Completion found ledger entries whose outcome is unknown: a pipeline defect, reported as a terminal failure that names them. */
export class UnresolvedEffectsError extends TerminalError {
  constructor(keys: readonly string[]) {
    super(`Cannot complete while effects are unresolved (applying or unknown): ${keys.join(', ')}; the pipeline must reconcile them before it finishes`);
  }
}

/** The last phase is checkpointed: publish the answer and complete, in one commit conditioned on the job. */
export async function complete(running: Running, claim: JobClaim, states: ReadonlyMap<string, unknown>, notes: readonly EventDraft[]): Promise<StepOutcome> {
  const { store } = running.deps;
  const lastPhase = running.pipeline.phases[running.pipeline.phases.length - 1] as PhaseDefinition<unknown, unknown>;
  const context = bareContext(running, claim.jobId, { ...lastPhase, needs: running.pipeline.phases }, states, 'publication');
  let result;
  try {
    result = running.pipeline.publish(context);
  } catch (error) {
    return settleError(running.deps, claim, toPhaselineError(error), EMPTY_FLUSH, notes);
  }
  const nowMs = store.clock.now();
  try {
    // One commit conditioned on the job: no transaction locks it while the effects and the outbox are read.
    await store.apply({ kind: 'job', claim }, async ({ job }) => {
      // Both read side by side: neither depends on the other, and the commit is conditioned on the job either way.
      const [ledger, outbox] = await Promise.allSettled([unresolvedEffectsOf(store, job.id), outboxPublished(store, job)]);
      // A job cannot complete while an effect's outcome is unknown: the pipeline must reconcile it first (whatever the outbox read did).
      if (ledger.status === 'fulfilled' && ledger.value.length > 0) throw new UnresolvedEffectsError(ledger.value);
      if (ledger.status === 'rejected') throw ledger.reason;
      if (outbox.status === 'rejected') throw outbox.reason;
      const published = outbox.value;
      const completed = completeJob(job, { outcome: result.outcome, missing: result.missing }, nowMs);
      // The outbox ID is the job's own: an answer already there (a job an operator released after it
      // had published) is kept as it is, never published a second time. Created, not set: an answer
      // that appears after this read fails the commit, which is decided again.
      const answer = { jobId: job.id, owner: job.owner, role: 'assistant', pipeline: job.pipeline, outcome: result.outcome, title: result.title, markdown: result.markdown, missing: result.missing, createdAtMs: nowMs };
      return { next: completed.next, events: [...notes, ...completed.events], documents: published ? [] : [{ kind: 'outbox', document: answer }], value: undefined };
    });
  } catch (error) {
    if (error instanceof OwnershipLostError) return lost(running, error);
    if (error instanceof UnresolvedEffectsError) return settleError(running.deps, claim, error, EMPTY_FLUSH, notes);
    throw error;
  }
  return { kind: 'completed', outcome: result.outcome };
}
