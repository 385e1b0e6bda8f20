/**
 * Job and unit documents: the claim fields both records share are stored alike, and every record
 * comes back from its document as it went in; a malformed claim field is refused in either.
 */
import { Timestamp } from 'firebase-admin/firestore';
import { CorruptCheckpointError, UnreadableJobError } from '../../functions/src/core/errors';
import { newQueuedJob, type JobRecord, type LeaseHolder, type UnitRecord } from '../../functions/src/core/job';
import { decodeJob, decodeUnit, encodeJob, encodeUnit, encodeUnitFlush } from '../../functions/src/store/codec';

const NOW = 1_700_000_000_000;
/** The claim fields a running job and a running unit below share, epoch, lease and last error aside. */
const claimPart = {
  status: 'running',
  step: 3,
  dispatch: 1,
  attempts: 2,
  staleReclaims: 1,
  nextRunAtMs: NOW - 5,
  progress: { sections: 2 },
  cost: { usd: 1.25 },
  claimTally: { epoch: 4, cost: { usd: 0.5 }, notes: 2 },
  updatedAtMs: NOW + 1,
} as const satisfies Omit<LeaseHolder, 'epoch' | 'lease' | 'lastError'>;

const runningJob: JobRecord = {
  ...newQueuedJob({ id: 'j1', owner: 'user-1', pipeline: 'p', input: { topic: 't' }, conversationId: null, idempotencyKey: 'k', pipelineVersion: 2 }, NOW),
  ...claimPart,
  phase: 'draft',
  epoch: 4,
  lease: { epoch: 4, worker: 'w', expiresAtMs: NOW + 90_000, renewedAtMs: NOW },
  lastError: { code: 'rate_limited', message: 'slow down', retryable: true, atMs: NOW - 10 },
  effectsToSettleAtMs: null,
};

const runningUnit: UnitRecord = {
  jobId: 'j1',
  unit: 'u1',
  phase: 'experts',
  fanoutEpoch: 4,
  ...claimPart,
  epoch: 2,
  lease: { epoch: 2, worker: 'w', expiresAtMs: NOW + 90_000, renewedAtMs: NOW },
  costInJob: { usd: 1 },
  result: { answer: 42 },
  resultVersion: 2,
  lastError: { code: 'timeout', message: 'took too long', atMs: NOW - 10 },
};

const CLAIM_FIELDS = ['status', 'epoch', 'lease', 'step', 'dispatch', 'attempts', 'staleReclaims', 'nextRunAt', 'progress', 'cost', 'lastError', 'claimTally', 'updatedAt'];

function pick(data: Record<string, unknown>, keys: readonly string[]): Record<string, unknown> {
  return Object.fromEntries(keys.map((key) => [key, data[key]]));
}

test('a job and a unit come back from their documents as they went in', () => {
  expect(decodeJob('j1', encodeJob(runningJob))).toEqual(runningJob);
  expect(decodeUnit('jobs/j1/units/experts~u1', encodeUnit(runningUnit))).toEqual(runningUnit);
  const { resultVersion: _none, ...unversioned } = runningUnit;
  expect(decodeUnit('jobs/j1/units/experts~u1', encodeUnit({ ...unversioned, lastError: null, lease: null }))).toEqual({ ...unversioned, lastError: null, lease: null });
});

test('the claim fields are stored alike in both: times as timestamps, the lease with its renewal, the last error with its time; only a job error says whether it was retryable', () => {
  const job = encodeJob(runningJob);
  const unit = encodeUnit(runningUnit);
  const { lastError: jobError, epoch: _jobEpoch, lease: _jobLease, ...jobClaim } = pick(job, CLAIM_FIELDS);
  const { lastError: unitError, epoch: _unitEpoch, lease: _unitLease, ...unitClaim } = pick(unit, CLAIM_FIELDS);
  expect(jobClaim).toEqual(unitClaim);
  expect(unitClaim).toMatchObject({ nextRunAt: Timestamp.fromMillis(NOW - 5), updatedAt: Timestamp.fromMillis(NOW + 1) });
  expect(job.lease).toEqual({ epoch: 4, worker: 'w', expiresAt: Timestamp.fromMillis(NOW + 90_000), renewedAt: Timestamp.fromMillis(NOW) });
  expect(jobError).toEqual({ code: 'rate_limited', message: 'slow down', retryable: true, at: Timestamp.fromMillis(NOW - 10) });
  expect(unitError).toEqual({ code: 'timeout', message: 'took too long', at: Timestamp.fromMillis(NOW - 10) });
});

test('a malformed claim field is refused in either document, a job as unreadable (it is ended where it stands), a unit as corrupt', () => {
  const badEpoch = { epoch: -1 };
  expect(() => decodeJob('j1', { ...encodeJob(runningJob), ...badEpoch })).toThrow(UnreadableJobError);
  expect(() => decodeUnit('jobs/j1/units/experts~u1', { ...encodeUnit(runningUnit), ...badEpoch })).toThrow(CorruptCheckpointError);
  expect(() => decodeUnit('jobs/j1/units/experts~u1', { ...encodeUnit(runningUnit), status: 'cancelled' })).toThrow(/malformed document/);
  const { retryable: _dropped, ...withoutRetryable } = encodeJob(runningJob).lastError as Record<string, unknown>;
  expect(() => decodeJob('j1', { ...encodeJob(runningJob), lastError: withoutRetryable })).toThrow(/lastError/);
});

test('a document from before the claim tally existed reads with none; a unit flush writes only what a heartbeat renews', () => {
  const { claimTally: _tally, ...older } = encodeUnit(runningUnit);
  expect(decodeUnit('jobs/j1/units/experts~u1', older).claimTally).toBeNull();
  expect(Object.keys(encodeUnitFlush(runningUnit)).sort()).toEqual(['claimTally', 'cost', 'lease', 'progress', 'updatedAt']);
});
