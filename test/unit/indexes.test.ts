/**
 * The Firestore emulator runs queries without their composite indexes; production refuses them.
 * So every query shape the sweeper can run is checked here against firestore.indexes.json.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join, relative } from 'node:path';
import { z } from 'zod';
import {
  describeIndex,
  indexFor,
  indexServes,
  missingIndexes,
  SWEEP_QUERIES,
  SWEEP_QUERY_NAMES,
  type CompositeIndex,
} from '../../functions/src/engine/indexed-queries';
import { REJECTED_TASKS, SPEND_CHARGES, SPEND_DAYS } from '../../functions/src/store/paths';
import { EXPIRE_AT, EXPIRING_COLLECTION_GROUPS, EXPIRING_JOB_COLLECTIONS } from '../../functions/src/store/retention';

// firebase-tools ships no types for its internals; its spec validation runs offline.
const { FirestoreApi } = createRequire(__filename)('firebase-tools/lib/firestore/api') as { FirestoreApi: new () => unknown };

const indexFile = z.object({
  indexes: z.array(
    z.object({
      collectionGroup: z.string(),
      queryScope: z.enum(['COLLECTION', 'COLLECTION_GROUP']),
      fields: z.array(z.object({ fieldPath: z.string(), order: z.enum(['ASCENDING', 'DESCENDING']).optional(), arrayConfig: z.literal('CONTAINS').optional() })).min(2),
    }),
  ),
  fieldOverrides: z.array(z.unknown()).optional(),
});

const INDEX_FILE = join(__dirname, '..', '..', 'firestore.indexes.json');

function declaredIndexes(): CompositeIndex[] {
  const raw: unknown = JSON.parse(readFileSync(INDEX_FILE, 'utf8'));
  return indexFile.parse(raw).indexes;
}

test('firestore.indexes.json has a composite index for every query shape the sweeper runs', () => {
  expect(missingIndexes(declaredIndexes())).toEqual([]);
});

test('the sweeper declares the five query shapes of its four rules, three for the effects of stopped jobs and three for retention', () => {
  expect(SWEEP_QUERY_NAMES.sort()).toEqual([
    'cancelledEffectsToSettle',
    'cancelledRetentionDue',
    'completedRetentionDue',
    'expiredJobLeases',
    'expiredUnitLeases',
    'failedEffectsToSettle',
    'failedRetentionDue',
    'lostJobTasks',
    'lostUnitTasks',
    'quarantinedEffectsToSettle',
    'waitsOver',
  ]);
});

describe('TTL policies', () => {
  const overrides = (): { collectionGroup: string; fieldPath: string; ttl?: boolean | undefined; indexes: unknown[] }[] =>
    z
      .array(z.object({ collectionGroup: z.string(), fieldPath: z.string(), ttl: z.boolean().optional(), indexes: z.array(z.unknown()) }))
      .parse(indexFile.parse(JSON.parse(readFileSync(INDEX_FILE, 'utf8'))).fieldOverrides ?? []);

  test('every expiring collection group has a TTL policy on expireAt, unindexed, and nothing else expires', () => {
    const ttl = overrides().filter((override) => override.ttl === true);
    expect(ttl.map((override) => override.collectionGroup).sort()).toEqual([...EXPIRING_COLLECTION_GROUPS].sort());
    for (const override of ttl) expect(override).toEqual({ collectionGroup: override.collectionGroup, fieldPath: EXPIRE_AT, ttl: true, indexes: [] });
  });

  /**
   * Every place in functions/src that writes `expireAt` (the key `[EXPIRE_AT]:` or `expireAt:` with
   * a value other than a delete), with the collection groups those writes go to. A write added
   * anywhere else fails the count below: say here where it goes, and declare its TTL policy.
   */
  const EXPIRE_AT_WRITERS: Readonly<Record<string, { readonly writes: number; readonly groups: readonly string[] }>> = {
    'store/retention.ts': { writes: 1, groups: EXPIRING_JOB_COLLECTIONS },
    'store/job-store.ts': { writes: 1, groups: ['events'] },
    'store/job-documents.ts': { writes: 1, groups: [REJECTED_TASKS] },
    'store/quota-documents.ts': { writes: 3, groups: [SPEND_DAYS, SPEND_CHARGES] },
    'store/unreadable-jobs.ts': { writes: 1, groups: ['events'] },
  };
  const SOURCE_ROOT = join(__dirname, '..', '..', 'functions', 'src');
  const sourceFiles = (dir: string): string[] =>
    readdirSync(dir, { withFileTypes: true }).flatMap((entry) => (entry.isDirectory() ? sourceFiles(join(dir, entry.name)) : entry.name.endsWith('.ts') ? [join(dir, entry.name)] : []));
  /** The code of a file without its comments (none of the sources puts comment markers inside strings where it writes expireAt). */
  const code = (text: string): string => text.replace(/\/\*[\s\S]*?\*\//g, '').replace(/(^|[^:])\/\/.*$/gm, '$1');

  test('bug 35: every collection group the functions write expireAt to has its TTL policy declared (spend days included)', () => {
    const found: Record<string, number> = {};
    for (const file of sourceFiles(SOURCE_ROOT)) {
      const source = code(readFileSync(file, 'utf8'));
      const writes = source.match(/(\[EXPIRE_AT\]|\bexpireAt)\s*:(?!\s*FieldValue\.delete\(\))/g)?.length ?? 0;
      // The field's name is spelled once, as EXPIRE_AT: any other spelling would escape this count.
      const spelled = (source.match(/['"`]expireAt['"`]/g)?.length ?? 0) - (source.includes(`export const EXPIRE_AT = '${EXPIRE_AT}'`) ? 1 : 0);
      if (writes + spelled > 0) found[relative(SOURCE_ROOT, file)] = writes + spelled;
    }
    expect(found).toEqual(Object.fromEntries(Object.entries(EXPIRE_AT_WRITERS).map(([file, { writes }]) => [file, writes])));
    const ttl = new Set(overrides().filter((override) => override.ttl === true && override.fieldPath === EXPIRE_AT).map((override) => override.collectionGroup));
    const written = Object.values(EXPIRE_AT_WRITERS).flatMap(({ groups }) => groups);
    expect(written.filter((group) => !ttl.has(group))).toEqual([]);
    expect([...EXPIRING_COLLECTION_GROUPS].sort()).toEqual([...new Set(written)].sort());
  });

  test('the job document, its answer and its checkpoints are not among them', () => {
    for (const kept of ['jobs', 'results', 'messages', 'sections', 'checkpoints', 'units', 'claims', 'effects']) expect(EXPIRING_COLLECTION_GROUPS).not.toContain(kept);
  });

  test("firebase-tools' own validation (what `firebase deploy --only firestore:indexes` runs first) accepts the file", () => {
    // Its deploy upgrades the spec, then validates every index and field override before any API call.
    const api = new FirestoreApi() as { upgradeOldSpec: (spec: unknown) => unknown; validateSpec: (spec: unknown) => void };
    const spec = JSON.parse(readFileSync(INDEX_FILE, 'utf8')) as unknown;
    expect(() => api.validateSpec(api.upgradeOldSpec(spec))).not.toThrow();
    const broken = { indexes: [], fieldOverrides: [{ collectionGroup: 'events', fieldPath: EXPIRE_AT, ttl: 'yes', indexes: [] }] };
    expect(() => api.validateSpec(api.upgradeOldSpec(broken))).toThrow(/ttl/);
  });
});

test.each(SWEEP_QUERY_NAMES)('an index list without the index for %s is caught, naming the shape', (name) => {
  const shape = SWEEP_QUERIES[name];
  const indexes = declaredIndexes();
  const withoutIt = indexes.filter((index) => !indexServes(index, shape));
  expect(withoutIt).toHaveLength(indexes.length - 1);
  // Shapes that differ only in an equality value share an index: all of them are named.
  const sharing = SWEEP_QUERY_NAMES.filter((other) => !withoutIt.some((index) => indexServes(index, SWEEP_QUERIES[other])));
  expect(sharing).toContain(name);
  expect(missingIndexes(withoutIt).sort()).toEqual(sharing.map((other) => `${other}: ${describeIndex(SWEEP_QUERIES[other])}`).sort());
});

describe('an index only counts when it serves the query', () => {
  const shape = SWEEP_QUERIES.expiredUnitLeases;
  const good = indexFor(shape);

  test('the generated entry serves it, also with the implicit trailing __name__', () => {
    expect(indexServes(good, shape)).toBe(true);
    expect(indexServes({ ...good, fields: [...good.fields, { fieldPath: '__name__', order: 'ASCENDING' }] }, shape)).toBe(true);
  });

  test('the wrong scope does not (a collection index cannot serve a collection-group query)', () => {
    expect(indexServes({ ...good, queryScope: 'COLLECTION' }, shape)).toBe(false);
  });

  test('the range field before the equality field does not', () => {
    expect(indexServes({ ...good, fields: [...good.fields].reverse() }, shape)).toBe(false);
  });

  test('a descending range field does not (the sweeper orders ascending)', () => {
    expect(indexServes({ ...good, fields: [{ fieldPath: 'status', order: 'ASCENDING' }, { fieldPath: 'lease.expiresAt', order: 'DESCENDING' }] }, shape)).toBe(false);
  });

  test('another collection, or an extra field, does not', () => {
    expect(indexServes({ ...good, collectionGroup: 'jobs' }, shape)).toBe(false);
    expect(indexServes({ ...good, fields: [...good.fields, { fieldPath: 'nextRunAt', order: 'ASCENDING' }] }, shape)).toBe(false);
  });
});
