/**
 * Versions in flight, the pure parts: how a phase reads a checkpoint or section another version
 * wrote (core/versions.ts), what definePipeline accepts as version declarations, the unreadable
 * value a refused state becomes (engine/checkpoints.ts), and how a job document records the
 * version it started on (store/codec.ts).
 */
import { Timestamp } from 'firebase-admin/firestore';
import { z } from 'zod';
import { RetryableError, TerminalError } from '../../functions/src/core/errors';
import { newQueuedJob } from '../../functions/src/core/job';
import { definePhase, definePipeline, phaseVersionProblem, type OlderVersionReading, type PhaseDefinition } from '../../functions/src/core/pipeline';
import { phaseVersion, readStored } from '../../functions/src/core/versions';
import { checkpointDocumentFor, NewerVersionError, unreadableReason, unreadableValue, VersionRefusedError } from '../../functions/src/engine/checkpoints';
import { decodeJob, encodeJob } from '../../functions/src/store/codec';

type Input = { n: number };

/** Version 2 of a phase that renamed `value` (units) to `cents` and `total` to `totalCents`. */
function items(older: Readonly<Record<number, OlderVersionReading>> = {}, version = 2): PhaseDefinition<unknown, unknown> {
  return definePhase<unknown, unknown>({
    name: 'items',
    version,
    older,
    state: z.strictObject({ totalCents: z.number().int() }),
    section: z.strictObject({ cents: z.number().int() }),
    run: () => Promise.resolve({ kind: 'done', state: { totalCents: 0 } }),
  });
}

const migrateState = (old: unknown) => ({ totalCents: (old as { total: number }).total * 100 });
const migrateSection = (old: unknown) => ({ cents: (old as { value: number }).value * 100 });
const migrateV1: OlderVersionReading = { state: migrateState, section: migrateSection };

describe('readStored: by the version that wrote it', () => {
  test('the same version is parsed by the present schema; failing it is corrupt (redone, as before versions)', () => {
    const phase = items({ 1: migrateV1 });
    expect(readStored(phase, 'checkpoint', { totalCents: 300 }, 2)).toEqual({ kind: 'read', value: { totalCents: 300 }, migratedFrom: null });
    expect(readStored(phase, 'checkpoint', { total: 3 }, 2)).toMatchObject({ kind: 'corrupt' });
  });

  test('an earlier version with a migration is migrated, and the result is parsed by the present schema', () => {
    const phase = items({ 1: migrateV1 });
    expect(readStored(phase, 'checkpoint', { total: 3 }, 1)).toEqual({ kind: 'read', value: { totalCents: 300 }, migratedFrom: 1 });
    expect(readStored(phase, 'section', { value: 7 }, 1)).toEqual({ kind: 'read', value: { cents: 700 }, migratedFrom: 1 });
    // A migration whose result the present schema refuses is never trusted.
    const sloppy = items({ 1: { state: () => ({ totalCents: 'lots' }) } });
    const reading = readStored(sloppy, 'checkpoint', { total: 3 }, 1);
    expect(reading).toMatchObject({ kind: 'refused' });
    expect(reading.kind === 'refused' && reading.reason).toMatch(/^Phase items: its checkpoint migrated from version 1 fails the version 2 schema: /);
  });

  test('a migration that throws refuses the value, with its message', () => {
    const phase = items({ 1: { state: () => { throw new Error('no total in it'); } } });
    expect(readStored(phase, 'checkpoint', {}, 1)).toEqual({ kind: 'refused', reason: 'Phase items: migrating its checkpoint from version 1 failed: no total in it' });
  });

  test('a declared refusal, a version without a declaration, and a migration without this kind all refuse, saying why', () => {
    expect(readStored(items({ 1: { refuse: 'v1 totals were counted in another currency' } }), 'checkpoint', { total: 3 }, 1)).toEqual({
      kind: 'refused',
      reason: 'Phase items (version 2) refuses its checkpoint written by version 1: v1 totals were counted in another currency',
    });
    expect(readStored(items({}, 3), 'checkpoint', { total: 3 }, 1)).toEqual({
      kind: 'refused',
      reason: 'Phase items (version 3) cannot read its checkpoint written by version 1: it declares no way to read that version',
    });
    expect(readStored(items({ 1: { section: migrateSection } }), 'checkpoint', { total: 3 }, 1)).toEqual({
      kind: 'refused',
      reason: 'Phase items (version 2) declares a migration from version 1, but none for its checkpoint',
    });
  });

  test('a later version is never read: it is left for a worker of that version', () => {
    const reading = readStored(items({ 1: migrateV1 }), 'checkpoint', { totalCents: 1 }, 3);
    expect(reading.kind).toBe('newer');
    expect(reading.kind === 'newer' && reading.reason).toBe(
      "The checkpoint of phase items was written by its version 3, newer than this worker's version 2 (a deploy in progress, or a rollback): left for a worker of version 3 or later",
    );
  });
});

describe('readStored: a fan-out unit result', () => {
  /** Version 2 of a fan-out phase whose unit results went from `value` (units) to `cents`. */
  const priced = (older: Readonly<Record<number, OlderVersionReading>>) => ({ ...items(older), fanOut: { unitState: z.strictObject({ cents: z.number().int() }) } });

  test('bug 21: read by its fan-out unit schema: the same version as it is, an earlier one through the `unitState` migration, a later one never', () => {
    const phase = priced({ 1: { unitState: (old) => ({ cents: (old as { value: number }).value * 100 }) } });
    expect(readStored(phase, 'unit result', { cents: 5 }, 2)).toEqual({ kind: 'read', value: { cents: 5 }, migratedFrom: null });
    expect(readStored(phase, 'unit result', { value: 5 }, 2)).toMatchObject({ kind: 'corrupt' });
    expect(readStored(phase, 'unit result', { value: 5 }, 1)).toEqual({ kind: 'read', value: { cents: 500 }, migratedFrom: 1 });
    expect(readStored(phase, 'unit result', { cents: 5 }, 3)).toMatchObject({ kind: 'newer' });
    // A migration of the checkpoint and sections only: its unit results are refused (their units run again).
    expect(readStored(priced({ 1: migrateV1 }), 'unit result', { value: 5 }, 1)).toEqual({
      kind: 'refused',
      reason: 'Phase items (version 2) declares a migration from version 1, but none for its unit result',
    });
    expect(phaseVersionProblem({ version: 2, older: { 1: { unitState: (old) => old } } }, 2)).toBeNull();
  });
});

describe('readStored: a section recorded without its version', () => {
  test('the present schema first: a value it accepts is read as it is', () => {
    expect(readStored(items({ 1: migrateV1 }), 'section', { cents: 5 }, null)).toEqual({ kind: 'read', value: { cents: 5 }, migratedFrom: null });
  });

  test('else the declared migrations, newest first: the first whose result the present schema accepts', () => {
    const phase = items({ 1: migrateV1, 2: { section: (old) => ({ cents: (old as { amount: number }).amount }) } }, 3);
    expect(readStored(phase, 'section', { amount: 42 }, null)).toEqual({ kind: 'read', value: { cents: 42 }, migratedFrom: 2 });
    expect(readStored(phase, 'section', { value: 4 }, null)).toEqual({ kind: 'read', value: { cents: 400 }, migratedFrom: 1 });
  });

  test('a phase that declares a refusal refuses what no migration reads; one that declares nothing calls it corrupt, as before', () => {
    expect(readStored(items({ 1: { refuse: 'sections of v1 had no currency' } }), 'section', { value: 4 }, null)).toEqual({
      kind: 'refused',
      reason: 'Phase items (version 2) refuses a section its present schema rejects, taken as written by version 1: sections of v1 had no currency',
    });
    expect(readStored(items({}, 1), 'section', { value: 4 }, null)).toMatchObject({ kind: 'corrupt' });
    expect(readStored(items({ 1: { state: migrateState } }), 'section', { value: 4 }, null)).toMatchObject({ kind: 'refused' });
  });
});

describe('version declarations', () => {
  const publish = () => ({ outcome: 'complete' as const, title: 't', markdown: 'm', missing: [] });
  const define = (version: number | undefined, phase: Partial<PhaseDefinition<Input, unknown>>) =>
    definePipeline<Input>({
      name: 'p',
      description: 'test',
      input: z.object({ n: z.number() }),
      ...(version === undefined ? {} : { version }),
      phases: [{ name: 'a', state: z.unknown(), run: () => Promise.resolve({ kind: 'done', state: 1 }), ...phase }],
      publish,
    });

  test('versions default to 1; a phase at the pipeline version with a migration or a refusal per earlier version is accepted', () => {
    expect(phaseVersion({})).toBe(1);
    expect(() => define(undefined, {})).not.toThrow();
    expect(() => define(3, { version: 3, older: { 1: { refuse: 'too old' }, 2: { state: (old) => old } } })).not.toThrow();
  });

  test.each([
    [0, {}, 'version must be a whole number from 1'],
    [1.5, {}, 'version must be a whole number from 1'],
    [1, { version: 2 }, 'phase a has version 2: a phase\'s version is a whole number from 1 to its pipeline\'s version (1)'],
    [2, { version: 2, older: { 2: { refuse: 'x' } } }, 'declares how to read version 2, which is not an earlier version of it (1 to 1)'],
    [2, { version: 2, older: { 0: { refuse: 'x' } } }, 'declares how to read version 0'],
    [2, { version: 2, older: { 1: {} } }, 'must either migrate or refuse what version 1 wrote, not neither'],
    [2, { version: 2, older: { 1: { refuse: 'x', state: (old: unknown) => old } } }, 'must either migrate or refuse what version 1 wrote, not both'],
    [2, { version: 2, older: { 1: { refuse: '  ' } } }, 'refuses version 1 without a reason'],
  ])('pipeline version %p with phase %j is refused: %s', (version, phase, message) => {
    expect(() => define(version, phase as Partial<PhaseDefinition<Input, unknown>>)).toThrow(message);
  });

  test('phaseVersionProblem is what definePipeline checks, per phase', () => {
    expect(phaseVersionProblem({ version: 2, older: { 1: { refuse: 'x' } } }, 2)).toBeNull();
    expect(phaseVersionProblem({ version: 3 }, 2)).toMatch(/has version 3/);
  });

  test('a checkpoint records the version of the phase that wrote it', () => {
    expect(checkpointDocumentFor(items({ 1: migrateV1 }), { totalCents: 1 }, 4, 1_000)).toEqual({ phase: 'items', state: { totalCents: 1 }, epoch: 4, recordedAtMs: 1_000, version: 2 });
    expect(checkpointDocumentFor(items({}, 1), { totalCents: 1 }, 4, 1_000).version).toBe(1);
  });
});

describe('an unreadable value', () => {
  test('fails whatever reads it, with the refusal it carries', () => {
    const refusal = new VersionRefusedError('Phase items refuses it');
    const value = unreadableValue(refusal) as Record<string, unknown>;
    expect(() => value.total).toThrow(refusal);
    expect(() => ({ ...value })).toThrow(refusal);
    expect(() => JSON.stringify(value)).toThrow(refusal);
    expect(() => Number(value)).toThrow(refusal);
    expect(() => 'total' in value).toThrow(refusal);
    expect(() => Object.keys(value)).toThrow(refusal);
    expect(unreadableReason(value)).toBe(refusal);
    expect(unreadableReason({ total: 1 })).toBeNull();
    expect(unreadableReason(null)).toBeNull();
  });

  test('a refusal is terminal; a newer version retries a minute later', () => {
    expect(new VersionRefusedError('x')).toBeInstanceOf(TerminalError);
    const newer = new NewerVersionError('y');
    expect(newer).toBeInstanceOf(RetryableError);
    expect(newer.retryAfterMs).toBe(60_000);
  });
});

describe('the job records the version it started on', () => {
  const job = newQueuedJob({ id: 'j1', owner: 'u', pipeline: 'p', input: {}, conversationId: null, idempotencyKey: null, pipelineVersion: 2 }, 1_000);

  test('written and read back', () => {
    expect(job.pipelineVersion).toBe(2);
    expect(decodeJob('j1', encodeJob(job)).pipelineVersion).toBe(2);
  });

  test('a job document from before versions existed reads as version 1; one whose creator did not say reads as null', () => {
    const { pipelineVersion: _dropped, ...legacy } = encodeJob(job);
    expect(decodeJob('j1', legacy).pipelineVersion).toBe(1);
    const unsaid = newQueuedJob({ id: 'j2', owner: 'u', pipeline: 'p', input: {}, conversationId: null, idempotencyKey: null }, 1_000);
    expect(decodeJob('j2', encodeJob(unsaid)).pipelineVersion).toBeNull();
    expect(encodeJob(unsaid).createdAt).toBeInstanceOf(Timestamp);
  });
});
