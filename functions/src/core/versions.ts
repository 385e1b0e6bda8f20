/**
 * Versions in flight: how a phase reads a checkpoint, a section or a fan-out unit's result that
 * another version of its pipeline may have written (a deploy changed the phase's schema while jobs
 * were in flight across it, or a worker of the previous version still runs while the deploy rolls
 * out). Pure: the engine (engine/checkpoints.ts, and the fan-out's start and join) applies it to what
 * it loads.
 *
 * By the version that wrote the value (`writtenBy`) against the phase's own (`version`, default 1):
 *
 *   same     parsed by the present schema. A value that fails it is corrupt: refused and redone, as
 *            before versions existed.
 *   older    read through the phase's `older[writtenBy]`: migrated, then parsed by the present schema.
 *            No declaration for that version, a declared refusal, a migration that throws or gives a
 *            value the present schema refuses: the value is refused, and the job cannot go on under
 *            this version (it fails with the reason; an operator may re-drive it from that phase).
 *            A unit result refused costs less: its unit runs again under this version.
 *   newer    never read: a worker of an earlier version does not interpret what a later one wrote.
 *            The step is tried again later, by then on a worker of the newer version.
 *   unknown  a section recorded without its version (sections carry none yet: see the README's
 *            Versions): the present schema first; then the declared migrations, newest first; a
 *            declared refusal if no migration reads it. A phase that declares nothing treats a
 *            section its schema refuses as corrupt, as before.
 *
 * A stored value without a version that is not a section (a checkpoint or a unit result written
 * before versions existed) was written by version 1: every phase was at version 1 until versions existed.
 */
import { z } from 'zod';
import type { OlderVersionReading, PhaseDefinition, PhaseMigration } from './pipeline';

/** What a stored value is: a phase's checkpoint state, a section's data, or a fan-out unit's result. */
export type StoredKind = 'checkpoint' | 'section' | 'unit result';

export type StoredReading =
  /** Readable: as written (`migratedFrom` null) or migrated from that version. */
  | { readonly kind: 'read'; readonly value: unknown; readonly migratedFrom: number | null }
  /** Written by this version and failing its schema: not trusted; the work is redone. */
  | { readonly kind: 'corrupt'; readonly reason: string }
  /** Written by an earlier version this one cannot read: the job cannot go on under this version. */
  | { readonly kind: 'refused'; readonly reason: string }
  /** Written by a later version: left for a worker of that version. */
  | { readonly kind: 'newer'; readonly reason: string };

type VersionedPhase = Pick<PhaseDefinition<unknown, unknown>, 'name' | 'state' | 'section' | 'version' | 'older'> & { readonly fanOut?: Pick<NonNullable<PhaseDefinition<unknown, unknown>['fanOut']>, 'unitState'> };

export function phaseVersion(phase: Pick<PhaseDefinition<unknown, unknown>, 'version'>): number {
  return phase.version ?? 1;
}

/** Where each kind is declared: the phase's schema and a migration's function carry the same name. */
const DECLARED_AS = { checkpoint: 'state', section: 'section', 'unit result': 'unitState' } as const satisfies Record<StoredKind, keyof PhaseMigration>;

function schemaFor(phase: VersionedPhase, kind: StoredKind): z.ZodType | undefined {
  const field = DECLARED_AS[kind];
  return field === 'unitState' ? phase.fanOut?.unitState : phase[field];
}

function parsed(schema: z.ZodType | undefined, value: unknown): { ok: true; value: unknown } | { ok: false; reason: string } {
  if (schema === undefined) return { ok: true, value };
  const result = schema.safeParse(value);
  return result.success ? { ok: true, value: result.data } : { ok: false, reason: z.prettifyError(result.error) };
}

function migrationOf(reading: OlderVersionReading, kind: StoredKind): ((old: unknown) => unknown) | undefined {
  return 'refuse' in reading ? undefined : reading[DECLARED_AS[kind]];
}

/** Runs one declared migration and parses its result; the reason when either fails. */
function migrate(phase: VersionedPhase, kind: StoredKind, from: number, migration: (old: unknown) => unknown, stored: unknown): { ok: true; value: unknown } | { ok: false; reason: string } {
  let migrated: unknown;
  try {
    migrated = migration(stored);
  } catch (error) {
    return { ok: false, reason: `Phase ${phase.name}: migrating its ${kind} from version ${from} failed: ${error instanceof Error ? error.message : String(error)}` };
  }
  const result = parsed(schemaFor(phase, kind), migrated);
  if (!result.ok) return { ok: false, reason: `Phase ${phase.name}: its ${kind} migrated from version ${from} fails the version ${phaseVersion(phase)} schema: ${result.reason}` };
  return result;
}

/**
 * How `phase` reads a stored checkpoint state or section data that version `writtenBy` of it wrote
 * (null: not recorded, for sections only).
 */
export function readStored(phase: VersionedPhase, kind: StoredKind, stored: unknown, writtenBy: number | null): StoredReading {
  const version = phaseVersion(phase);
  if (writtenBy === null) return readUnversioned(phase, kind, stored);
  if (writtenBy === version) {
    const result = parsed(schemaFor(phase, kind), stored);
    return result.ok ? { kind: 'read', value: result.value, migratedFrom: null } : { kind: 'corrupt', reason: result.reason };
  }
  if (writtenBy > version) {
    return {
      kind: 'newer',
      reason:
        `The ${kind} of phase ${phase.name} was written by its version ${writtenBy}, newer than this worker's version ${version} ` +
        `(a deploy in progress, or a rollback): left for a worker of version ${writtenBy} or later`,
    };
  }
  const reading = phase.older?.[writtenBy];
  if (reading === undefined) {
    return { kind: 'refused', reason: `Phase ${phase.name} (version ${version}) cannot read its ${kind} written by version ${writtenBy}: it declares no way to read that version` };
  }
  if ('refuse' in reading) return { kind: 'refused', reason: `Phase ${phase.name} (version ${version}) refuses its ${kind} written by version ${writtenBy}: ${reading.refuse}` };
  const migration = migrationOf(reading, kind);
  if (migration === undefined) {
    return { kind: 'refused', reason: `Phase ${phase.name} (version ${version}) declares a migration from version ${writtenBy}, but none for its ${kind}` };
  }
  const result = migrate(phase, kind, writtenBy, migration, stored);
  return result.ok ? { kind: 'read', value: result.value, migratedFrom: writtenBy } : { kind: 'refused', reason: result.reason };
}

/** A value recorded without its version: the present schema, else the declared readings of earlier versions, newest first. */
function readUnversioned(phase: VersionedPhase, kind: StoredKind, stored: unknown): StoredReading {
  const current = parsed(schemaFor(phase, kind), stored);
  if (current.ok) return { kind: 'read', value: current.value, migratedFrom: null };
  const declared = Object.entries(phase.older ?? {})
    .map(([from, reading]) => ({ from: Number(from), reading }))
    .sort((a, b) => b.from - a.from);
  if (declared.length === 0) return { kind: 'corrupt', reason: current.reason };
  let refusal: string | null = null;
  const failures: string[] = [];
  for (const { from, reading } of declared) {
    if ('refuse' in reading) {
      refusal ??= `Phase ${phase.name} (version ${phaseVersion(phase)}) refuses a ${kind} its present schema rejects, taken as written by version ${from}: ${reading.refuse}`;
      continue;
    }
    const migration = migrationOf(reading, kind);
    if (migration === undefined) continue;
    const result = migrate(phase, kind, from, migration, stored);
    if (result.ok) return { kind: 'read', value: result.value, migratedFrom: from };
    failures.push(result.reason);
  }
  if (refusal !== null) return { kind: 'refused', reason: refusal };
  return {
    kind: 'refused',
    reason:
      `Phase ${phase.name} (version ${phaseVersion(phase)}): a ${kind} recorded without its version fails the present schema ` +
      `(${current.reason}), and no declared migration reads it${failures.length > 0 ? ` (${failures.join('; ')})` : ''}`,
  };
}
