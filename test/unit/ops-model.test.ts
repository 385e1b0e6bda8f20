/**
 * The operator console's model (web/src/ops-model.ts): its pipeline and phase list matches the
 * functions' registry, every query it runs has its composite index in firestore.indexes.json (the
 * emulator does not enforce them; production refuses a query without one), and a job document
 * reads as the row, age and actions an operator sees.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { z } from 'zod';
import { deployedPipelines } from '../../functions/src/pipelines';
import {
  actionsFor,
  countKey,
  countQueries,
  countTable,
  COUNTED_STATUSES,
  ENDED_WINDOW_HOURS,
  formatAge,
  LIST_QUERIES,
  listEntry,
  longRunning,
  phasesOf,
  PIPELINE_PHASES,
  PIPELINES,
  readOpsJob,
  type CountCell,
} from '../../web/src/ops-model';

const INDEX_FILE = join(__dirname, '..', '..', 'firestore.indexes.json');
const indexFile = z.object({
  indexes: z.array(z.object({ collectionGroup: z.string(), queryScope: z.string(), fields: z.array(z.object({ fieldPath: z.string(), order: z.string().optional() })) })),
});
type Index = z.infer<typeof indexFile>['indexes'][number];
const declared = (): Index[] => indexFile.parse(JSON.parse(readFileSync(INDEX_FILE, 'utf8'))).indexes;

/** Equality fields first (any order), then the ordered or ranged field in its direction; nothing else. */
function serves(index: Index, equals: readonly string[], last: { field: string; order: 'ASCENDING' | 'DESCENDING' }): boolean {
  if (index.collectionGroup !== 'jobs' || index.queryScope !== 'COLLECTION' || index.fields.length !== equals.length + 1) return false;
  const leading = index.fields.slice(0, equals.length).map((field) => field.fieldPath);
  const final = index.fields[equals.length];
  return [...leading].sort().join() === [...equals].sort().join() && final?.fieldPath === last.field && final.order === last.order;
}

describe('the console and the functions agree', () => {
  test("the pipelines and their phases are the registry's", () => {
    const registry = deployedPipelines(() => {
      throw new Error('no Firestore in a unit test');
    });
    const fromRegistry = Object.fromEntries([...registry].map(([name, pipeline]) => [name, pipeline.phases.map((phase) => phase.name)]));
    expect(PIPELINE_PHASES).toEqual(fromRegistry);
  });

  test.each(Object.entries(LIST_QUERIES))('the %s list has its composite index', (_name, shape) => {
    const order = shape.direction === 'asc' ? 'ASCENDING' : 'DESCENDING';
    expect(declared().some((index) => serves(index, ['status'], { field: shape.orderBy, order }))).toBe(true);
  });

  test('the counts of ended statuses over the recent window have their composite index; the others are equality only', () => {
    const shapes = countQueries(Date.UTC(2026, 0, 2));
    expect(shapes).toHaveLength(PIPELINES.length * COUNTED_STATUSES.length);
    const ranged = shapes.filter((shape) => shape.finishedSinceMs !== null);
    expect(new Set(ranged.map((shape) => shape.status))).toEqual(new Set(['completed', 'failed', 'cancelled']));
    for (const shape of ranged) expect(shape.finishedSinceMs).toBe(Date.UTC(2026, 0, 2) - ENDED_WINDOW_HOURS * 3_600_000);
    expect(declared().some((index) => serves(index, ['pipeline', 'status'], { field: 'finishedAt', order: 'ASCENDING' }))).toBe(true);
  });

  test('the index check itself refuses an index in the wrong direction or on another field', () => {
    const statusFirst = (field: string, order: string): Index => ({ collectionGroup: 'jobs', queryScope: 'COLLECTION', fields: [{ fieldPath: 'status', order: 'ASCENDING' }, { fieldPath: field, order }] });
    expect(serves(statusFirst('updatedAt', 'DESCENDING'), ['status'], { field: 'updatedAt', order: 'DESCENDING' })).toBe(true);
    expect(serves(statusFirst('updatedAt', 'ASCENDING'), ['status'], { field: 'updatedAt', order: 'DESCENDING' })).toBe(false);
    expect(serves(statusFirst('createdAt', 'DESCENDING'), ['status'], { field: 'updatedAt', order: 'DESCENDING' })).toBe(false);
  });
});

describe('a job as the console reads it', () => {
  const NOW = Date.UTC(2026, 4, 1, 12, 0, 0);
  const timestamp = (ms: number) => ({ toMillis: () => ms });
  const base = {
    owner: 'user-7',
    pipeline: 'research',
    input: { question: 'Why <b>leases</b>?' },
    attempts: 2,
    staleReclaims: 4,
    epoch: 5,
    step: 9,
    phase: 'expert-content',
    cost: { spentUsd: 0.002, modelCalls: 3, toolCalls: 1 },
    createdAt: timestamp(NOW - 3 * 3_600_000),
    updatedAt: timestamp(NOW - 5 * 60_000),
  };

  test('a quarantined job: its reason, and its age since it was quarantined', () => {
    const job = readOpsJob('job-q', { ...base, status: 'quarantined', quarantine: { reason: 'lost 4 workers without progress', at: timestamp(NOW - 20 * 60_000) }, finishedAt: null });
    expect(job).toMatchObject({ owner: 'user-7', rawStatus: 'quarantined', step: 9, quarantinedAtMs: NOW - 20 * 60_000 });
    expect(listEntry('quarantined', job)).toMatchObject({ reason: 'lost 4 workers without progress', sinceMs: NOW - 20 * 60_000 });
    expect(actionsFor('quarantined')).toEqual(new Set(['release', 'redrive']));
  });

  test('a failed job: its last error, and its age since it ended', () => {
    const job = readOpsJob('job-f', { ...base, status: 'failed', lastError: { code: 'provider_error', message: 'HTTP 400', retryable: false, at: timestamp(NOW - 61_000) }, finishedAt: timestamp(NOW - 60_000) });
    expect(listEntry('failed', job)).toEqual({ job, reason: 'provider_error: HTTP 400', sinceMs: NOW - 60_000 });
    expect(actionsFor('failed')).toEqual(new Set(['redrive']));
  });

  test('a waiting job: what it waits for, including a reason this page does not know', () => {
    const decision = readOpsJob('job-w', { ...base, status: 'waiting', waiting: { reason: 'decision', questionId: 'q', question: 'How deep?', options: [], until: null } });
    expect(listEntry('waiting', decision).reason).toBe("for its owner's decision: How deep?");
    const provider = readOpsJob('job-p', { ...base, status: 'waiting', waiting: { reason: 'provider', questionId: 'q', question: 'down', options: [], until: timestamp(Date.UTC(2026, 4, 1, 13)) } });
    expect(listEntry('waiting', provider).reason).toBe('for a provider to recover (resumes at 2026-05-01T13:00:00.000Z)');
    const budget = readOpsJob('job-b', { ...base, status: 'waiting', waiting: { reason: 'budget', questionId: 'q', question: 'Spend limit reached', options: [], until: null } });
    expect(listEntry('waiting', budget).reason).toBe('budget: Spend limit reached');
    expect(actionsFor('waiting')).toEqual(new Set(['cancel']));
  });

  test('long-running: running jobs submitted more than N minutes ago, oldest first', () => {
    const running = (id: string, minutesAgo: number) => readOpsJob(id, { ...base, status: 'running', createdAt: timestamp(NOW - minutesAgo * 60_000) });
    const jobs = [running('fresh', 5), running('old', 90), running('older', 300), readOpsJob('undated', { ...base, status: 'running', createdAt: null })];
    expect(longRunning(jobs, 30, NOW).map((job) => job.view.id)).toEqual(['older', 'old']);
    expect(listEntry('long-running', running('old', 90))).toMatchObject({ reason: 'expert-content (attempts 2, lost workers 4)', sinceMs: NOW - 90 * 60_000 });
    expect(actionsFor('running')).toEqual(new Set(['cancel']));
  });

  test('a document with missing or odd fields still reads, and an unknown status allows no action', () => {
    const job = readOpsJob('odd', { status: 'exploded', owner: 42, createdAt: 'yesterday' });
    expect(job).toMatchObject({ owner: '?', rawStatus: 'exploded', createdAtMs: null, waitingReason: null, step: 0 });
    expect(listEntry('quarantined', job)).toMatchObject({ reason: 'no reason recorded', sinceMs: null });
    expect(actionsFor('exploded').size).toBe(0);
    expect(actionsFor('cancelled').size).toBe(0);
  });

  test('re-drive offers the phases of the job\'s pipeline, none for an unknown one', () => {
    expect(phasesOf('research')).toEqual(['outline', 'perspectives', 'expert-content', 'final-document']);
    expect(phasesOf('toString')).toEqual([]);
    expect(phasesOf('unknown')).toEqual([]);
  });
});

test.each([
  [0, '0 s'],
  [59_999, '59 s'],
  [60_000, '1 min'],
  [3_600_000, '1 h'],
  [3_900_000, '1 h 5 min'],
  [86_400_000, '1 d'],
  [90_000_000, '1 d 1 h'],
  [-5_000, '0 s'],
])('formatAge(%i) is %s', (ms, label) => {
  expect(formatAge(ms)).toBe(label);
});

test('the counts table sums the pipelines, and a failed count shows as failed in the total', () => {
  const counts = new Map<string, CountCell>();
  for (const pipeline of PIPELINES) for (const status of COUNTED_STATUSES) counts.set(countKey(pipeline, status), { kind: 'count', value: 1 });
  const table = countTable(counts);
  expect(table.rows.map((row) => row.pipeline)).toEqual([...PIPELINES, 'all']);
  expect(table.rows.at(-1)?.cells.every((cell) => cell?.kind === 'count' && cell.value === PIPELINES.length)).toBe(true);
  counts.set(countKey('research', 'failed'), { kind: 'error', message: 'permission-denied' });
  counts.delete(countKey('canary', 'queued'));
  const degraded = countTable(counts).rows.at(-1)?.cells ?? [];
  expect(degraded[COUNTED_STATUSES.indexOf('failed')]).toEqual({ kind: 'error', message: 'permission-denied' });
  expect(degraded[COUNTED_STATUSES.indexOf('queued')]).toBeNull();
});
