/**
 * Re-drive, the pure parts: the `redrive` transition of the lifecycle table (which statuses it
 * leaves from, what it resets and clears, what the timeline says, its task), the engine's refusal
 * by status, and the CLI's `redrive` command line.
 */
import { JOB_STATUSES, newQueuedJob, type JobRecord, type JobStatus } from '../../functions/src/core/job';
import { allowedJobMove, JOB_TRANSITIONS, redriveJobRecord, TransitionRefused } from '../../functions/src/core/transitions';
import { redriveRefusal } from '../../functions/src/engine/operator';
import { parseInvocation } from '../../scripts/cli/args';
import { UsageError } from '../../scripts/cli/errors';

const NOW = 5_000_000;

function job(overrides: Partial<JobRecord> = {}): JobRecord {
  const request = { id: 'job-1', owner: 'user-1', pipeline: 'p', input: {}, conversationId: null, idempotencyKey: null, pipelineVersion: 1 };
  return {
    ...newQueuedJob(request, 0),
    status: 'completed',
    outcome: 'partial',
    phase: null,
    epoch: 6,
    step: 9,
    dispatch: 2,
    attempts: 3,
    staleReclaims: 2,
    finishedAtMs: NOW - 1_000,
    lastError: { code: 'terminal', message: 'the plan was wrong', retryable: false, atMs: NOW - 1_000 },
    retention: { dueAtMs: NOW - 1_000, cursor: 'events/j00000003' },
    effectsToSettleAtMs: NOW + 60_000,
    decisions: { q1: 'yes' },
    ...overrides,
  };
}

const input = { fromPhase: 'send', by: 'ops-ana', reason: 'the receiver lost a day of messages', setAside: 12, auditPrefix: 'r1e6~', resumesAt: 'send' };
const otherThan = (...statuses: JobStatus[]) => JOB_STATUSES.filter((status) => !statuses.includes(status));

describe('the redrive transition', () => {
  test('the table: from completed, failed or quarantined to queued, and nothing else', () => {
    expect(JOB_TRANSITIONS.redrive).toEqual({ from: ['completed', 'failed', 'quarantined'], to: ['queued'] });
    for (const status of ['completed', 'failed', 'quarantined'] as const) expect(allowedJobMove(status, 'queued')).toBe(true);
    expect(allowedJobMove('cancelled', 'queued')).toBe(false);
  });

  test.each(['completed', 'failed', 'quarantined'] as const)('a %s job goes back to the queue at a new step with fresh budgets, what ended it cleared', (status) => {
    const before = job({ status, ...(status === 'quarantined' ? { quarantine: { reason: 'it keeps killing its workers', atMs: NOW - 1_000 } } : {}) });
    const { next, events, dispatch } = redriveJobRecord(before, input, NOW);
    expect(next).toMatchObject({
      status: 'queued',
      outcome: null,
      phase: 'send',
      step: 10,
      dispatch: 0,
      nextRunAtMs: NOW,
      lease: null,
      attempts: 0,
      staleReclaims: 0,
      finishedAtMs: null,
      quarantine: null,
      lastError: null,
      waiting: null,
      fanout: null,
      // The sweeper must not go on stamping (expiring) the documents of a job that runs again.
      retention: null,
      redrive: { count: 1, fromPhase: 'send', by: 'ops-ana', reason: 'the receiver lost a day of messages', atMs: NOW, previousStatus: status, setAside: 12, auditPrefix: 'r1e6~' },
    });
    // The epoch is the next claim's to raise; the owner's answers and the effects still to settle stay.
    expect(next.epoch).toBe(6);
    expect(next.decisions).toEqual({ q1: 'yes' });
    expect(next.effectsToSettleAtMs).toBe(NOW + 60_000);
    expect(dispatch).toEqual({ task: { jobId: 'job-1', step: 10 }, id: 'job-1-s10-d0', delayMs: 0 });
    expect(events).toHaveLength(1);
    expect(events[0]?.kind).toBe('redriven');
    expect(events[0]?.message).toContain('Re-driven from send by ops-ana: the receiver lost a day of messages.');
    expect(events[0]?.message).toContain('12 documents of send and later phases set aside for audit (setAside/r1e6~…)');
    expect(events[0]?.message).toContain('resuming at step 10');
  });

  test('the timeline says what ended the job, and where it resumes when an earlier phase was never finished', () => {
    const failed = redriveJobRecord(job({ status: 'failed' }), { ...input, resumesAt: 'plan' }, NOW);
    expect(failed.events[0]?.message).toContain('It was failed (the plan was wrong)');
    expect(failed.events[0]?.message).toContain('; it resumes at plan, an earlier phase it never finished;');
    expect(failed.next.phase).toBe('plan');
    const quarantined = redriveJobRecord(job({ status: 'quarantined', quarantine: { reason: 'poison', atMs: 0 } }), input, NOW);
    expect(quarantined.events[0]?.message).toContain('It was quarantined (poison)');
    expect(redriveJobRecord(job(), input, NOW).events[0]?.message).toContain('It was completed;');
  });

  test('each re-drive is counted', () => {
    const again = redriveJobRecord(job({ redrive: { ...input, count: 2, atMs: 0, previousStatus: 'failed' } }), input, NOW);
    expect(again.next.redrive?.count).toBe(3);
  });

  test.each(otherThan('completed', 'failed', 'quarantined'))('a %s job is refused', (status) => {
    expect(() => redriveJobRecord(job({ status }), input, NOW)).toThrow(TransitionRefused);
  });
});

describe('redriveRefusal', () => {
  test('says why each status cannot be re-driven; null for those that can', () => {
    for (const status of ['completed', 'failed', 'quarantined'] as const) expect(redriveRefusal({ id: 'j', status })).toBeNull();
    expect(redriveRefusal({ id: 'j', status: 'running' })).toBe("Job j is running; only a completed, failed or quarantined job can be re-driven (a running job is still in the engine's hands).");
    expect(redriveRefusal({ id: 'j', status: 'queued' })).toMatch(/^Job j is queued; only a completed, failed or quarantined job/);
    expect(redriveRefusal({ id: 'j', status: 'waiting' })).toMatch(/^Job j is waiting; /);
    expect(redriveRefusal({ id: 'j', status: 'cancelled' })).toBe(
      'Job j was cancelled by its owner; a re-drive would resume the work (and the effects) they stopped. They can submit it again.',
    );
  });
});

describe('phaseline redrive', () => {
  const command = (...argv: string[]) => parseInvocation(argv).command;
  const usageError = (argv: string[]): UsageError => {
    try {
      parseInvocation(argv);
    } catch (error) {
      if (error instanceof UsageError) return error;
      throw error;
    }
    throw new Error(`no usage error for ${JSON.stringify(argv)}`);
  };

  test('parses the job, the phase, the reason and who', () => {
    expect(command('redrive', 'job-1', '--from', 'send', '--reason', 'lost messages')).toEqual({ name: 'redrive', jobId: 'job-1', fromPhase: 'send', reason: 'lost messages' });
    expect(command('redrive', 'job-1', '--from=send', '--reason=why', '--by', 'ana')).toEqual({ name: 'redrive', jobId: 'job-1', fromPhase: 'send', reason: 'why', by: 'ana' });
  });

  test.each([
    [['redrive', '--from', 'send', '--reason', 'x'], 'redrive needs a job ID'],
    [['redrive', 'job-1', '--reason', 'x'], 'redrive needs the phase to run again from'],
    [['redrive', 'job-1', '--from', 'Send!', '--reason', 'x'], '--from must be a phase name'],
    [['redrive', 'job-1', '--from', 'send'], 'redrive needs --reason'],
    [['redrive', 'job-1', '--from', 'send', '--reason', '  '], 'redrive needs --reason'],
    [['redrive', 'job-1', '--from', 'send', '--reason', 'x', '--by', ''], '--by must not be empty'],
    [['redrive', 'job-1', 'job-2', '--from', 'send', '--reason', 'x'], 'redrive got unexpected arguments'],
  ])('%j is a usage error: %s', (argv, message) => {
    expect(usageError(argv).message).toContain(message);
  });
});
