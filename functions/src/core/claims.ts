/**
 * Claims and their checks, pure: who holds a job or a fan-out unit is decided from its record
 * alone (status, epoch, lease), so the store, the engine and the sweeper all ask the same question.
 */
import type { JobRecord, UnitRecord } from './job';
import { currentFanOut } from './transitions';

/** The holder of a job claim: the job and the fencing epoch it was claimed under. */
export interface JobClaim {
  readonly jobId: string;
  readonly epoch: number;
}

/** The holder of a unit claim: the unit, its own epoch, and the job epoch of the fan-out it belongs to. */
export interface UnitClaim {
  readonly jobId: string;
  readonly phase: string;
  readonly unit: string;
  readonly epoch: number;
  readonly fanoutEpoch: number;
}

export function holdsClaim(job: JobRecord, claim: JobClaim): boolean {
  return job.status === 'running' && job.epoch === claim.epoch && job.lease?.epoch === claim.epoch;
}

/**
 * The unit's records (and its claim slot's epoch, when the slot exists) name this claim. The slot
 * carries the same fencing epoch as the records, written by the same commits: one check of both.
 */
export function holdsUnitClaim(job: JobRecord, unit: UnitRecord, claim: UnitClaim, slotEpoch: number | null = null): boolean {
  return (
    currentFanOut(job)?.epoch === claim.fanoutEpoch &&
    unit.fanoutEpoch === claim.fanoutEpoch &&
    unit.status === 'running' &&
    unit.epoch === claim.epoch &&
    unit.lease?.epoch === claim.epoch &&
    (slotEpoch === null || slotEpoch === claim.epoch)
  );
}

/** The epoch of the claim a job record says is held, or null (no worker holds the job). */
export function heldJobEpoch(job: Pick<JobRecord, 'status' | 'lease'>): number | null {
  return job.status === 'running' && job.lease !== null ? job.lease.epoch : null;
}

export function heldUnitEpoch(unit: Pick<UnitRecord, 'status' | 'lease'>): number | null {
  return unit.status === 'running' && unit.lease !== null ? unit.lease.epoch : null;
}

/** Why a job claim no longer holds, or null while it does. */
export function jobClaimRefusal(job: JobRecord, claim: JobClaim): string | null {
  return holdsClaim(job, claim) ? null : `Claim epoch ${claim.epoch} no longer owns job ${claim.jobId} (status ${job.status}, epoch ${job.epoch})`;
}

/** Why a unit claim no longer holds (its records, or its claim slot revoked), or null while it does. */
export function unitClaimRefusal(job: JobRecord, unit: UnitRecord, claim: UnitClaim, slotRevoked = false, slotEpoch: number | null = null): string | null {
  if (holdsUnitClaim(job, unit, claim, slotEpoch) && !slotRevoked) return null;
  return `Unit claim epoch ${claim.epoch} no longer owns ${claim.jobId}/${claim.unit} (unit ${unit.status}, epoch ${unit.epoch}; job ${job.status}${slotRevoked ? '; claim slot revoked' : ''})`;
}
