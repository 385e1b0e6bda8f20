/**
 * Unit records as a test needs them: every field set to a quiet default (queued, epoch 0, no
 * lease, nothing spent), so a test names only what it is about. Pure data, for every layer.
 */
import type { UnitRecord } from '../../functions/src/core/job';

export type UnitFields = Pick<UnitRecord, 'jobId' | 'unit' | 'phase'> & Partial<UnitRecord>;

export function unitRecord(fields: UnitFields): UnitRecord {
  return {
    fanoutEpoch: 0,
    status: 'queued',
    epoch: 0,
    lease: null,
    step: 0,
    dispatch: 0,
    attempts: 0,
    staleReclaims: 0,
    nextRunAtMs: 0,
    progress: {},
    cost: {},
    costInJob: {},
    claimTally: null,
    result: null,
    lastError: null,
    updatedAtMs: 0,
    ...fields,
  };
}
