/**
 * What the commit that ends a fan-out carries for its units besides their revoked claims (the
 * store's): the job's cost is its own plus every unit's recorded cost, so the units whose cost the
 * job has not counted yet are charged in that same commit, each written with its cost marked
 * counted under the update time it was read at. A unit that recorded more since that read fails the
 * commit, which is then decided again; after it, no unit of the fan-out can record anything.
 */
import type { Transaction } from 'firebase-admin/firestore';
import type { JobRecord } from '../core/job';
import { chargeUnit, chargeUnits } from '../core/transitions';
import { readFanOutUnits } from '../store/checkpoint-reads';
import { decodeUnit, type UnitRecord } from '../store/codec';
import type { JobWriter } from '../store/firestore-handle';
import type { JobStore } from '../store/job-store';

export interface FanOutCharge {
  /** The unit the commit writes itself (the one ending the fan-out): the caller charges it, so it is not written twice. */
  readonly except?: string;
  /** The commit's transaction, when it is one: the units are read in it. */
  readonly transaction?: Transaction;
}

/** Charges `job` (as the commit will write it) the uncounted cost of every unit of the fan-out it is leaving, writing those units in `tx`. */
export async function chargeEndedFanOut(store: JobStore, tx: JobWriter, job: JobRecord, fanout: JobRecord['fanout'], options: FanOutCharge = {}): Promise<JobRecord> {
  if (fanout === null) return job;
  const documents = (await readFanOutUnits(store, job.id, fanout.epoch, options.transaction)).map((snapshot) => ({ snapshot, unit: decodeUnit(snapshot.ref.path, snapshot.data()) }));
  const units = documents.filter(({ unit }) => unit.phase === fanout.phase && unit.unit !== options.except);
  const { job: charged, charged: written } = chargeUnits(job, units.map(({ unit }) => unit));
  for (const next of written) {
    const read = units.find(({ unit }) => unit.unit === next.unit);
    if (read) store.commitUnit(tx, read.snapshot, next, read.unit);
  }
  return charged;
}

/**
 * The job and unit records of a commit in which `unit` ends its job's fan-out (`ended`: the job as
 * the ending transition leaves it, `job`: as read): the job is charged what the unit and every other
 * unit of the fan-out recorded and it has not counted, those other units written in `tx`.
 */
export async function endFanOutFromUnit(store: JobStore, tx: JobWriter, job: JobRecord, unit: UnitRecord, ended: JobRecord, transaction?: Transaction): Promise<{ next: JobRecord; nextUnit: UnitRecord }> {
  const charged = chargeUnit(ended, unit);
  const options: FanOutCharge = transaction ? { except: unit.unit, transaction } : { except: unit.unit };
  return { next: await chargeEndedFanOut(store, tx, charged.job, job.fanout, options), nextUnit: charged.unit };
}
