/**
 * What the commit that ends a fan-out carries for its units besides their revoked claims (the
 * store's): the job's cost is its own plus every unit's recorded cost, so the units whose cost the
 * job has not counted yet are charged in that same commit (core/fan-out-moves.ts decides), each
 * written with its cost marked counted under the update time it was read at. A unit that recorded
 * more since that read fails the commit, which is then decided again; after it, no unit of the
 * fan-out can record anything.
 */
import type { Transaction } from 'firebase-admin/firestore';
import { chargeFanOut, type FanOutMove } from '../core/fan-out-moves';
import { chargeUnit } from '../core/transitions';
import type { JobRecord, UnitRecord } from '../core/job';
import { readFanOutUnits } from '../store/checkpoint-reads';
import { decodeUnit } from '../store/codec';
import type { Change, DocumentWrite } from '../store/door';
import type { JobWriter } from '../store/firestore-handle';
import type { JobStore } from '../store/job-store';

/** The change of a unit's move that ends (or joins) its job's fan-out: the fan-out's units are read now; those the move charged are rewritten, and the others fenced, conditioned on this read. */
export async function fanOutMoveChange(store: JobStore, job: JobRecord, move: (others: readonly UnitRecord[]) => FanOutMove): Promise<Required<Pick<Change<unknown>, 'next' | 'nextUnit' | 'events' | 'documents'>>> {
  const reads = job.fanout === null ? [] : await store.readFanOutUnits(job.id, job.fanout.epoch);
  const made = move(reads.map(({ record }) => record));
  const documents: DocumentWrite[] = [];
  for (const read of reads) {
    const { phase, unit, fanoutEpoch } = read.record;
    // The moving unit is written by the commit itself, under its own precondition.
    if (phase === made.unit.phase && unit === made.unit.unit) continue;
    const next = made.charged.find((charged) => charged.phase === phase && charged.unit === unit);
    // Every sibling decided from is fenced, charged or not: one that records more cost since this read fails the commit, which is decided again with it.
    documents.push(next ? { kind: 'unit', read, next } : { kind: 'unchanged', read: { path: store.unitRef(job.id, phase, unit).path, updateTime: read.updateTime }, field: 'fanoutEpoch', value: fanoutEpoch });
  }
  return { next: made.job, nextUnit: made.unit, events: made.events, documents };
}

/** Options of the transaction variants below (the sweeper's and an owner's cancel, which commit in a Firestore transaction). */
export interface FanOutCharge {
  /** The unit the commit writes itself (the one ending the fan-out): the caller charges it, so it is not written twice. */
  readonly except?: string;
  /** The commit's transaction, when it is one: the units are read in it. */
  readonly transaction?: Transaction;
}

/** Charges `job` (as the commit will write it) the uncounted cost of every unit of the fan-out it is leaving, writing those units in `tx`. */
export async function chargeEndedFanOut(store: JobStore, tx: JobWriter, job: JobRecord, fanout: JobRecord['fanout'], options: FanOutCharge = {}): Promise<JobRecord> {
  if (fanout === null) return job;
  const snapshots = await readFanOutUnits(store, job.id, fanout.epoch, options.transaction);
  const units = snapshots.map((snapshot) => ({ snapshot, unit: decodeUnit(snapshot.ref.path, snapshot.data()) }));
  const { job: charged, charged: written } = chargeFanOut(job, fanout, units.map(({ unit }) => unit), options.except);
  for (const next of written) {
    const read = units.find(({ unit }) => unit.phase === next.phase && unit.unit === next.unit);
    if (read) store.commitUnit(tx, read.snapshot, next, read.unit);
  }
  return charged;
}

/** The job and unit records of a transaction's commit in which `unit` ends its job's fan-out (`ended`: the job as the ending transition leaves it). */
export async function endFanOutFromUnit(store: JobStore, tx: JobWriter, job: JobRecord, unit: UnitRecord, ended: JobRecord, transaction?: Transaction): Promise<{ next: JobRecord; nextUnit: UnitRecord }> {
  const charged = chargeUnit(ended, unit);
  const options: FanOutCharge = transaction ? { except: unit.unit, transaction } : { except: unit.unit };
  return { next: await chargeEndedFanOut(store, tx, charged.job, job.fanout, options), nextUnit: charged.unit };
}
