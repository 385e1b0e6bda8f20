/** Fan-out: the coordinating step writes one unit document per unit and hands the work to unit tasks; the unit that finishes last joins, in the commit that records it. */
import { describeError, TerminalError, type PhaselineError } from '../../core/errors';
import { finishUnit, holdJoinForReruns, joinViaUnit, startUnit } from '../../core/fan-out-moves';
import { documentIdProblem } from '../../core/ids';
import { EMPTY_FLUSH, type FlushPayload } from '../../core/flusher';
import { type UnitRecord } from '../../core/job';
import { rerunUnit, startFanOutJob, unitDispatch, type Dispatch } from '../../core/transitions';
import { type PhaseDefinition, type PipelineDefinition, type StepContext } from '../../core/pipeline';
import { phaseVersion, readStored, type StoredReading } from '../../core/versions';
import type { DocumentWrite, EventDraft } from '../../store/door';
import { checkpointDocumentFor, loadCheckpoints, NewerVersionError } from '../checkpoints';
import type { ClaimScope } from './claim-scope';
import type { StepOutcome } from './deps';
import { errorDecision, settle, settlingRefusals, type Decision, type JobHolder, type UnitHolder } from './settle';

// ---------------------------------------------------------------------------------------------
// Fan-out: the coordinating step writes one unit document per unit and hands the work to unit
// tasks; the job stays `running` without a lease while its units hold theirs. The unit that
// finishes last joins, in the same conditioned commit that records it, so the join happens exactly once.
//
// The invariant this keeps (checked by tests and the chaos soak over every job): a job that is
// `running` without a lease is in a fan-out with at least one unit queued (with a due time the
// sweeper acts on) or leased. So a fan-out that needs no unit work (no units, or every unit reused)
// joins in the very commit that starts it: there is no moment at which it has no live unit.

/** Thrown inside a fan-out commit when the pipeline's `join` fails: a defect, so the job fails with it. */
export class JoinFailedError extends TerminalError {}

/** A join that failed, or a unit result only a newer worker reads: settled as the step's error, in the commit that found it. */
const isFanOutRefusal = (error: unknown): error is PhaselineError => error instanceof JoinFailedError || error instanceof NewerVersionError;

/**
 * How this version of the phase reads a finished unit's result (core/versions.ts): as it is when
 * this version produced it; migrated when an earlier one did and the phase declares a migration for
 * it; otherwise not at all (`refused`, `corrupt`: the unit runs again; `newer`: left for a worker of
 * that version). A result recorded before versions existed was produced by version 1.
 */
export function readUnitResult(phase: PhaseDefinition<unknown, unknown>, unit: Pick<UnitRecord, 'result' | 'resultVersion'>): StoredReading {
  return readStored(phase, 'unit result', unit.result, unit.resultVersion ?? 1);
}

/** Joins a fan-out; anything that fails in it (a unit result or a join that no longer validates) fails the job with that reason. */
export function joinState(phase: PhaseDefinition<unknown, unknown>, results: () => ReadonlyMap<string, unknown>, context: StepContext<unknown>): unknown {
  const fanOut = phase.fanOut;
  if (!fanOut) throw new Error(`Phase ${phase.name} has no fan-out`);
  try {
    return phase.state.parse(fanOut.join(results(), context));
  } catch (error) {
    throw new JoinFailedError(`Phase ${phase.name} could not join its units: ${describeError(error)}`);
  }
}

/** The phase after `phase` (or itself when it is the last): where the job goes once it checkpoints. */
export function phaseAfter(pipeline: PipelineDefinition<unknown>, phase: PhaseDefinition<unknown, unknown>): string {
  const index = pipeline.phases.findIndex((candidate) => candidate.name === phase.name);
  return pipeline.phases[index + 1]?.name ?? phase.name;
}

/** The join's checkpoint, written in the commit that joins. */
function joinCheckpoint(phase: PhaseDefinition<unknown, unknown>, state: unknown, epoch: number, nowMs: number): DocumentWrite {
  return { kind: 'checkpoint', phase: phase.name, document: checkpointDocumentFor(phase, state, epoch, nowMs) };
}

/** The coordinating step: lists the units, then one commit writes them and the job's fan-out (joined at once when no unit has work). */
export async function startFanOut(scope: ClaimScope<JobHolder>, phase: PhaseDefinition<unknown, unknown>, states: ReadonlyMap<string, unknown>): Promise<StepOutcome> {
  const fanOut = phase.fanOut;
  if (!fanOut) throw new Error(`Phase ${phase.name} has no fan-out`);
  let unitIds: readonly string[];
  try {
    unitIds = [...new Set(fanOut.units(scope.bareContext(phase, states, 'a fan-out coordinator')))];
    const refusedUnit = unitIds.find((unit) => documentIdProblem(unit) !== null);
    if (refusedUnit !== undefined) throw new Error(`unit ID ${JSON.stringify(refusedUnit.slice(0, 140))} ${documentIdProblem(refusedUnit)}`);
  } catch (error) {
    return settle(scope, EMPTY_FLUSH, errorDecision(scope, new TerminalError(`Phase ${phase.name} could not list its units: ${describeError(error)}`), scope.notes));
  }
  return settle(scope, EMPTY_FLUSH, settlingRefusals(scope, fanOutStart(scope, phase, unitIds), isFanOutRefusal, scope.notes));
}

/** One commit conditioned on the job (and each unit on the version read here): no transaction locks the job while the units are read. */
function fanOutStart(scope: ClaimScope<JobHolder>, phase: PhaseDefinition<unknown, unknown>, unitIds: readonly string[]): Decision<JobHolder> {
  const { store } = scope.deps;
  const epoch = scope.holder.claim.epoch;
  const nowMs = store.clock.now();
  return async ({ job }) => {
    // Unit documents are keyed by phase and unit ID: another fan-out phase never sees them.
    const versions = await store.readUnitVersions(job.id, phase.name, unitIds);
    const toEnqueue: UnitRecord[] = [];
    const reused = new Map<string, unknown>();
    const records = versions.map(({ unit, record: existing }) => {
      // A unit finished under an earlier fan-out of this phase is reused if this version reads its result (as it is, or
      // migrated from the earlier version that produced it); one it cannot read runs again under this version. One a
      // later version produced is never read: the fan-out is left for a worker of that version.
      const reading = existing?.status === 'done' ? readUnitResult(phase, existing) : null;
      if (reading?.kind === 'newer') throw new NewerVersionError(`Unit ${unit}: ${reading.reason}`);
      const readable = reading?.kind === 'read' ? { value: reading.value } : null;
      const record = startUnit(existing, { jobId: job.id, phase: phase.name, unit, fanoutEpoch: epoch, reused: readable, resultVersion: phaseVersion(phase) }, nowMs);
      if (readable) reused.set(unit, readable.value);
      else toEnqueue.push(record);
      return record;
    });
    const fanout = { phase: phase.name, epoch, units: unitIds.length, done: reused.size, unitIds };
    const documents: DocumentWrite[] = [{ kind: 'fan-out-units', units: records.map((record, position) => ({ record, updateTime: versions[position]?.updateTime ?? null })) }];
    let joinedNextPhase: string | null = null;
    if (toEnqueue.length === 0) {
      const loaded = await loadCheckpoints(store, job.id, scope.work.pipeline);
      documents.push(joinCheckpoint(phase, joinState(phase, () => reused, scope.bareContext(phase, loaded.states, 'a join')), epoch, nowMs));
      joinedNextPhase = phaseAfter(scope.work.pipeline, phase);
    }
    const transition = startFanOutJob(job, { fanout, joinedNextPhase }, nowMs);
    return {
      lead: scope.notes,
      next: transition.next,
      events: transition.events,
      documents,
      dispatch: [transition.dispatch, ...toEnqueue.map((unit) => unitDispatch(unit))],
      value: { kind: 'fanned-out', phase: phase.name, units: unitIds.length },
    };
  };
}

/**
 * Records a finished unit and, if it was the last one, joins: the phase checkpoint from every
 * unit's result and the job's hand-off to its next step, all in the commit that records it
 * (conditioned on the job, the unit and its claim slot). A sibling's result this version cannot
 * read (an earlier version's without a migration for it, or one failing its schema) is not joined:
 * that unit runs again, in the same commit, and the last of the reruns joins. A sibling's result a
 * later version produced is never read: a NewerVersionError leaves this unit (and so the join) to
 * a worker of that version. The finishing commit can lose to its siblings' job writes for longer
 * than a lease: between tries, a stale lease is renewed (see ClaimScope.renewedIfStale).
 */
export function finish(scope: ClaimScope<UnitHolder>, phase: PhaseDefinition<unknown, unknown>, pending: FlushPayload, result: unknown): Promise<StepOutcome> {
  const racing = { deps: scope.deps, holder: { ...scope.holder, whileRacing: (unit: UnitRecord) => scope.renewedIfStale(unit) } };
  return settle(racing, pending, settlingRefusals(racing, finishAndJoin(scope, phase, result), isFanOutRefusal));
}

function finishAndJoin(scope: ClaimScope<UnitHolder>, phase: PhaseDefinition<unknown, unknown>, result: unknown): Decision<UnitHolder> {
  const { store } = scope.deps;
  const { claim } = scope.holder;
  const nowMs = store.clock.now();
  return async ({ job, unit }) => {
    const finished = finishUnit(job, unit, { result, resultVersion: phaseVersion(phase) });
    const recorded = { nextUnit: finished.unit, lead: finished.events };
    if (!finished.last) return { ...recorded, next: finished.job, value: { kind: 'unit-done', unit: claim.unit, joined: false } };
    const [siblings, loaded] = await Promise.all([store.readFanOutUnits(claim.jobId, claim.fanoutEpoch), loadCheckpoints(store, claim.jobId, scope.work.pipeline)]);
    const results = new Map<string, unknown>([[claim.unit, result]]);
    const events: EventDraft[] = [];
    const documents: DocumentWrite[] = [];
    const reruns: Dispatch[] = [];
    for (const read of siblings) {
      const sibling = read.record;
      if (sibling.phase !== phase.name || sibling.unit === claim.unit) continue;
      if (sibling.status !== 'done') throw new JoinFailedError(`Phase ${phase.name} could not join its units: unit ${sibling.unit} is ${sibling.status}, though the fan-out counts every unit finished`);
      const reading = readUnitResult(phase, sibling);
      if (reading.kind === 'newer') throw new NewerVersionError(`${claim.unit} finished, but the fan-out of ${phase.name} cannot join on this worker: unit ${sibling.unit}'s ${reading.reason}`);
      if (reading.kind === 'read') {
        results.set(sibling.unit, reading.value);
        continue;
      }
      // Not joined silently with this version's results, and not a reason to fail the job: the unit runs again under this version.
      const rerun = rerunUnit(sibling, { why: reading.reason }, nowMs);
      documents.push({ kind: 'unit', read, next: rerun.next });
      events.push(...rerun.events);
      if (rerun.dispatch) reruns.push(rerun.dispatch);
    }
    if (reruns.length > 0) return { ...recorded, next: holdJoinForReruns(finished, reruns.length), events, documents, dispatch: reruns, value: { kind: 'unit-done', unit: claim.unit, joined: false } };
    const state = joinState(phase, () => results, scope.bareContext(phase, loaded.states, 'a join'));
    const joined = joinViaUnit(finished, { nextPhase: phaseAfter(scope.work.pipeline, phase), message: `${phase.name}: all ${finished.job.fanout?.units ?? 0} units finished` }, nowMs);
    return {
      ...recorded,
      next: joined.next,
      events: [...events, ...joined.events],
      documents: [joinCheckpoint(phase, state, claim.fanoutEpoch, nowMs)],
      dispatch: joined.dispatch,
      value: { kind: 'unit-done', unit: claim.unit, joined: true },
    };
  };
}
