/**
 * An operator's cancel is recorded as `cancellation.by`. Documents written before
 * the field existed must decode everywhere (engine codec, web model, CLI views, chaos collector);
 * an owner's cancel reads as the owner's; and what displays a cancellation names the operator.
 * Before the change the operator was named in the reason itself (`operator X: why`), so every
 * display that shows only the reason showed who cancelled.
 */
import { Timestamp } from 'firebase-admin/firestore';
import { newQueuedJob, type Cancellation, type JobRecord } from '../../functions/src/core/job';
import { cancellationReport } from '../../functions/src/effects/stop-report';
import { redriveRefusal } from '../../functions/src/engine/operator';
import { decodeJob, encodeJob } from '../../functions/src/store/codec';
import { jobDocFrom } from '../../scripts/chaos/collect';
import { finalLines, stateDetail } from '../../scripts/cli/format';
import { jobViewFromData, jobViewFromRecord } from '../../scripts/cli/views';
import { readJob } from '../../client';

const NOW = 1_700_000_000_000;

function cancelledRecord(cancellation: Cancellation): JobRecord {
  const queued = newQueuedJob({ id: 'j1', owner: 'user-1', pipeline: 'two-phase', input: { sections: 1 }, conversationId: null, idempotencyKey: null, pipelineVersion: null }, NOW);
  return { ...queued, status: 'cancelled', phase: 'second', finishedAtMs: NOW + 1_000, cancellation };
}

/** The stored document of a job cancelled before `by` existed: the cancellation map has no `by` key. */
function legacyDocument(reason: string): Record<string, unknown> {
  const encoded = encodeJob(cancelledRecord({ atMs: NOW, reason, by: null, phase: 'second', sectionsDone: 2, effects: null }));
  const { by: _by, ...cancellation } = encoded.cancellation as Record<string, unknown>;
  expect(cancellation).not.toHaveProperty('by');
  return { ...encoded, cancellation };
}

/** The same document as the CLI's REST reader hands it over: timestamps as Dates. */
function asRest(data: Record<string, unknown>): Record<string, unknown> {
  return JSON.parse(JSON.stringify(data), (_key, value: unknown) => {
    if (value && typeof value === 'object' && '_seconds' in value && '_nanoseconds' in value) {
      const { _seconds, _nanoseconds } = value as { _seconds: number; _nanoseconds: number };
      return new Date(_seconds * 1000 + _nanoseconds / 1e6);
    }
    return value;
  }) as Record<string, unknown>;
}

describe('documents written before cancellation.by existed', () => {
  const legacy = legacyDocument('changed my mind');

  test('engine codec: decodes, by is null, and it reads as the owner\'s cancel', () => {
    const job = decodeJob('j1', legacy);
    expect(job.cancellation).toMatchObject({ reason: 'changed my mind', by: null, phase: 'second', sectionsDone: 2 });
    expect(cancellationReport(job.cancellation!)).toBe('Cancelled by its owner during second (changed my mind). 2 sections were finished.');
    expect(redriveRefusal(job)).toMatch(/was cancelled by its owner/);
  });

  test('web job model: decodes, and it reads as the owner\'s cancel', () => {
    const view = readJob('j1', legacy);
    expect(view.status).toBe('cancelled');
    expect(view.cancellation?.report).toBe('Cancelled by its owner during second (changed my mind). 2 sections were finished.');
  });

  test('CLI views: decodes (REST shape), by null; its final lines read as the owner\'s cancel', () => {
    const view = jobViewFromData('j1', asRest(legacy));
    expect(view.cancellation).toMatchObject({ reason: 'changed my mind', by: null });
    expect(finalLines(view, 'out.md').join('\n')).toContain('Cancelled by its owner during second (changed my mind).');
  });

  test('chaos collector: decodes both ways (its own reader and the engine codec)', () => {
    expect(jobDocFrom(legacy).cancellation).toEqual({ reason: 'changed my mind', effectsSettled: null });
    expect(() => decodeJob('j1', legacy)).not.toThrow();
  });

  test('a stored by of null (an owner cancel written after the change) decodes everywhere too', () => {
    const stored = encodeJob(cancelledRecord({ atMs: NOW, reason: 'owner', by: null, phase: null, sectionsDone: null, effects: null }));
    expect((stored.cancellation as Record<string, unknown>).by).toBeNull();
    expect(decodeJob('j1', stored).cancellation?.by).toBeNull();
    expect(readJob('j1', stored).cancellation?.report).toBe('Cancelled by its owner during its first step (owner).');
    expect(jobViewFromData('j1', asRest(stored)).cancellation?.by).toBeNull();
    expect((stored.cancellation as Record<string, unknown>).at).toBeInstanceOf(Timestamp);
  });
});

describe("an operator's cancel, as every display shows it", () => {
  const record = cancelledRecord({ atMs: NOW, reason: 'runaway spend', by: 'op-alice', phase: 'second', sectionsDone: null, effects: null });
  const stored = encodeJob(record);

  test('the stop report, the web model and the re-drive refusal name the operator', () => {
    expect(cancellationReport(decodeJob('j1', stored).cancellation!)).toBe('Cancelled by operator op-alice during second (runaway spend).');
    expect(readJob('j1', stored).cancellation?.report).toBe('Cancelled by operator op-alice during second (runaway spend).');
    expect(redriveRefusal(decodeJob('j1', stored))).toMatch(/was cancelled by operator op-alice/);
  });

  test("the CLI's final lines name the operator", () => {
    expect(finalLines(jobViewFromRecord(record), 'out.md').join('\n')).toContain('Cancelled by operator op-alice');
  });

  // Before the change the reason was `operator op-alice: runaway spend`, so this line named the operator.
  test("the CLI's status line (list, watch) names the operator, not only the reason", () => {
    const line = stateDetail(jobViewFromRecord(record));
    expect(line).toContain('runaway spend');
    expect(line).toContain('op-alice');
  });

  test('the CLI status line of an owner cancel does not name an operator', () => {
    const owner = cancelledRecord({ atMs: NOW, reason: 'changed my mind', by: null, phase: 'second', sectionsDone: null, effects: null });
    expect(stateDetail(jobViewFromRecord(owner))).toBe('cancelled: changed my mind');
  });
});
