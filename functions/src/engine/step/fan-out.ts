/** Fan-out: the coordinating step writes one unit document per unit and hands the work to unit tasks; the unit that finishes last joins, in the commit that records it. */
import { describeError, OwnershipLostError, TerminalError } from '../../core/errors';
import { documentIdProblem } from '../../core/ids';
import { applyClaimTally, EMPTY_FLUSH, type FlushPayload } from '../../core/flusher';
import { type JobRecord } from '../../core/job';
import { chargeUnit, joinJob, rerunUnit, startFanOutJob, unitDispatch, type Dispatch } from '../../core/transitions';
import { type PhaseDefinition, type StepContext } from '../../core/pipeline';
import { phaseVersion, readStored, type StoredReading } from '../../core/versions';
import { decodeUnit, type UnitRecord } from '../../store/codec';
import type { JobClaim, UnitClaim } from '../../core/claims';
import type { EventDraft } from '../../store/door';
import { readFanOutUnits } from '../../store/checkpoint-reads';
import { checkpointDocumentFor, loadCheckpoints, NewerVersionError } from '../checkpoints';
import { Running, StepOutcome, bareContext, dispatchQuietly, freshLease, lost } from './running';
import { settleError } from './settle';

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
export function phaseAfter(running: Running, phase: PhaseDefinition<unknown, unknown>): string {
  const index = running.pipeline.phases.findIndex((candidate) => candidate.name === phase.name);
  return running.pipeline.phases[index + 1]?.name ?? phase.name;
}

export async function startFanOut(
  running: Running,
  claim: JobClaim,
  phase: PhaseDefinition<unknown, unknown>,
  states: ReadonlyMap<string, unknown>,
  notes: readonly EventDraft[],
): Promise<StepOutcome> {
  const { store } = running.deps;
  const fanOut = phase.fanOut;
  if (!fanOut) throw new Error(`Phase ${phase.name} has no fan-out`);
  const context = bareContext(running, claim.jobId, phase, states, 'a fan-out coordinator');
  let unitIds: readonly string[];
  try {
    unitIds = [...new Set(fanOut.units(context))];
    const refusedUnit = unitIds.find((unit) => documentIdProblem(unit) !== null);
    if (refusedUnit !== undefined) throw new Error(`unit ID ${JSON.stringify(refusedUnit.slice(0, 140))} ${documentIdProblem(refusedUnit)}`);
  } catch (error) {
    return settleError(running.deps, claim, new TerminalError(`Phase ${phase.name} could not list its units: ${describeError(error)}`), EMPTY_FLUSH, notes);
  }
  const nowMs = store.clock.now();
  let started: { readonly toEnqueue: readonly UnitRecord[]; readonly dispatch: Dispatch | undefined };
  try {
    // One commit conditioned on the job (and each unit on the version read here): no transaction locks the job while the units are read.
    started = await store.asOwner(claim, async ({ tx, job }) => {
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
        const record: UnitRecord = {
          jobId: job.id,
          unit,
          phase: phase.name,
          fanoutEpoch: claim.epoch,
          status: readable ? 'done' : 'queued',
          epoch: existing?.epoch ?? 0,
          lease: null,
          step: (existing?.step ?? -1) + 1,
          dispatch: 0,
          attempts: 0,
          staleReclaims: existing?.staleReclaims ?? 0,
          nextRunAtMs: nowMs,
          progress: existing?.progress ?? {},
          // Spent before stays spent and counted: a re-run adds only what it spends itself.
          cost: existing?.cost ?? {},
          costInJob: existing?.costInJob ?? {},
          claimTally: null,
          result: readable ? readable.value : null,
          // A reused result is this version's now (read as it is, or migrated): the join reads it as such.
          ...(readable ? { resultVersion: phaseVersion(phase) } : {}),
          lastError: null,
          updatedAtMs: nowMs,
        };
        if (readable) reused.set(unit, readable.value);
        else toEnqueue.push(record);
        return record;
      });
      const fanout = { phase: phase.name, epoch: claim.epoch, units: unitIds.length, done: reused.size, unitIds };
      let joinedNextPhase: string | null = null;
      if (toEnqueue.length === 0) {
        const loaded = await loadCheckpoints(store, job.id, running.pipeline);
        const state = joinState(phase, () => reused, bareContext(running, job.id, phase, loaded.states, 'a join'));
        tx.set(store.checkpointRef(job.id, phase.name), checkpointDocumentFor(phase, state, claim.epoch, nowMs));
        joinedNextPhase = phaseAfter(running, phase);
      }
      const transition = startFanOutJob(job, { fanout, joinedNextPhase }, nowMs);
      store.putFanOutUnits(tx, records.map((record, position) => ({ record, updateTime: versions[position]?.updateTime ?? null })));
      return { next: transition.next, events: [...notes, ...transition.events], value: { toEnqueue, dispatch: transition.dispatch } };
    });
  } catch (error) {
    if (error instanceof OwnershipLostError) return lost(running, error);
    if (error instanceof JoinFailedError || error instanceof NewerVersionError) return settleError(running.deps, claim, error, EMPTY_FLUSH, notes);
    throw error;
  }
  await dispatchQuietly(running.deps, started.dispatch);
  for (const unit of started.toEnqueue) await dispatchQuietly(running.deps, unitDispatch(unit));
  return { kind: 'fanned-out', phase: phase.name, units: unitIds.length };
}

/**
 * The finishing commit runs after the unit's flusher stopped, and in a big fan-out it can lose to its
 * siblings' job writes for longer than a lease: between tries, a lease older than a heartbeat is
 * renewed (a unit-only commit, which the hot job document does not hold up), so the sweeper never
 * takes a live unit's finished work away.
 */
async function renewWhileRacing(running: Running, claim: UnitClaim, unit: UnitRecord): Promise<void> {
  const { store } = running.deps;
  const lease = unit.lease;
  if (lease === null) return;
  const renewedAtMs = lease.renewedAtMs ?? lease.expiresAtMs - store.options.leaseSeconds * 1000;
  if (store.clock.now() - renewedAtMs < store.options.heartbeatSeconds * 1000) return;
  await store.commitAsUnitOwner(claim, ({ unit: current }) => Promise.resolve({ nextUnit: { ...current, lease: freshLease(running, claim.epoch) }, value: undefined }));
}

/** What a finishing unit's commit left to dispatch: the join's hand-off, or units that must run again before the join. */
export interface FinishedUnit {
  readonly joined: boolean;
  readonly dispatches: readonly Dispatch[];
}

/**
 * Records a finished unit and, if it was the last one, joins: the phase checkpoint from every
 * unit's result and the job's hand-off to its next step, all in the commit that records it
 * (conditioned on the job, the unit and its claim slot). A sibling's result this version cannot
 * read (an earlier version's without a migration for it, or one failing its schema) is not joined:
 * that unit runs again, in the same commit, and the last of the reruns joins. A sibling's result a
 * later version produced is never read: a NewerVersionError leaves this unit (and so the join) to
 * a worker of that version.
 */
export async function finishUnit(running: Running, claim: UnitClaim, phase: PhaseDefinition<unknown, unknown>, pending: FlushPayload, result: unknown): Promise<FinishedUnit> {
  const { store } = running.deps;
  const fanOut = phase.fanOut;
  if (!fanOut) throw new Error(`Phase ${phase.name} has no fan-out`);
  const nowMs = store.clock.now();
  const settled = await store.commitAsUnitOwner<FinishedUnit>(claim, async ({ tx, job, unit }) => {
    const fanout = job.fanout;
    if (fanout?.epoch !== claim.fanoutEpoch) throw new OwnershipLostError(`Job ${claim.jobId} is no longer in fan-out epoch ${claim.fanoutEpoch}`);
    const applied = applyClaimTally(unit, pending, claim.epoch);
    const charged = chargeUnit(job, applied.next);
    const done = fanout.done + 1;
    const next: JobRecord = { ...charged.job, fanout: { ...fanout, done } };
    const nextUnit: UnitRecord = { ...charged.unit, status: 'done', lease: null, result, resultVersion: phaseVersion(phase) };
    const events: EventDraft[] = [{ kind: 'unit-done', message: `${claim.unit} finished` }, ...applied.notes];
    if (done < fanout.units) return { next, nextUnit, events, value: { joined: false, dispatches: [] } };
    const [siblings, loaded] = await Promise.all([readFanOutUnits(store, claim.jobId, claim.fanoutEpoch), loadCheckpoints(store, claim.jobId, running.pipeline)]);
    const results = new Map<string, unknown>([[claim.unit, result]]);
    const reruns: Dispatch[] = [];
    for (const doc of siblings) {
      const sibling = decodeUnit(doc.ref.path, doc.data());
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
      store.commitUnit(tx, doc, rerun.next, sibling);
      events.push(...rerun.events);
      if (rerun.dispatch) reruns.push(rerun.dispatch);
    }
    if (reruns.length > 0) return { next: { ...next, fanout: { ...fanout, done: done - reruns.length } }, nextUnit, events, value: { joined: false, dispatches: reruns } };
    const state = joinState(phase, () => results, bareContext(running, claim.jobId, phase, loaded.states, 'a join'));
    tx.set(store.checkpointRef(claim.jobId, phase.name), checkpointDocumentFor(phase, state, claim.fanoutEpoch, nowMs));
    const joined = joinJob(next, { nextPhase: phaseAfter(running, phase), message: `${phase.name}: all ${fanout.units} units finished` }, nowMs);
    return { next: joined.next, nextUnit, events: [...events, ...joined.events], value: { joined: true, dispatches: joined.dispatch ? [joined.dispatch] : [] } };
  }, { beforeRetry: (unit) => renewWhileRacing(running, claim, unit) });
  for (const dispatch of settled.dispatches) await dispatchQuietly(running.deps, dispatch);
  return settled;
}
