/**
 * Every query the sweeper runs, declared as data. The sweeper runs its Firestore queries only
 * from these shapes (store/sweep-queries.ts builds and pages them), and a unit test checks each one
 * against firestore.indexes.json: the Firestore emulator does not enforce composite indexes, so a
 * missing one would only show in production.
 *
 * Each shape is equality filters with fixed values, then one range filter `field <= bound`, ordered
 * by that field and then the document ID (the cursor the sweeper pages with). Such a query needs the
 * composite index (equality fields..., range field ASCENDING); the trailing document-ID order is
 * implicit in every index.
 */
import { JOBS } from '../store/paths';
import type { QueryShape } from '../store/sweep-queries';

export type { QueryScope, QueryShape } from '../store/sweep-queries';

export const UNITS = 'units';

export const SWEEP_QUERIES = {
  /** Jobs whose worker stopped heartbeating. */
  expiredJobLeases: { collection: JOBS, scope: 'COLLECTION', equals: { status: 'running' }, range: 'lease.expiresAt' },
  /** Fan-out units whose worker stopped heartbeating, across all jobs. */
  expiredUnitLeases: { collection: UNITS, scope: 'COLLECTION_GROUP', equals: { status: 'running' }, range: 'lease.expiresAt' },
  /** Queued jobs long past their run time: their task was lost. */
  lostJobTasks: { collection: JOBS, scope: 'COLLECTION', equals: { status: 'queued' }, range: 'nextRunAt' },
  /** Queued units long past their run time. */
  lostUnitTasks: { collection: UNITS, scope: 'COLLECTION_GROUP', equals: { status: 'queued' }, range: 'nextRunAt' },
  /** Provider waits whose time is up (decision waits have `until: null` and never match). */
  waitsOver: { collection: JOBS, scope: 'COLLECTION', equals: { status: 'waiting' }, range: 'waiting.until' },
  /**
   * Stopped jobs whose effect ledger is due for a check against the system of record
   * (engine/settle-stopped.ts). `effectsToSettleAt` is null once nothing is left to check, so these
   * match only work still to do; one query per stopped status keeps each an equality plus a range.
   */
  cancelledEffectsToSettle: { collection: JOBS, scope: 'COLLECTION', equals: { status: 'cancelled' }, range: 'effectsToSettleAt' },
  failedEffectsToSettle: { collection: JOBS, scope: 'COLLECTION', equals: { status: 'failed' }, range: 'effectsToSettleAt' },
  quarantinedEffectsToSettle: { collection: JOBS, scope: 'COLLECTION', equals: { status: 'quarantined' }, range: 'effectsToSettleAt' },
  /**
   * Ended jobs whose children still need `expireAt` (engine/retention.ts). `retention` is null once
   * they all carry it, so these match only work still to do; one query per ended status, because
   * quarantined and waiting jobs have not ended (an operator may release one).
   */
  completedRetentionDue: { collection: JOBS, scope: 'COLLECTION', equals: { status: 'completed' }, range: 'retention.dueAt' },
  failedRetentionDue: { collection: JOBS, scope: 'COLLECTION', equals: { status: 'failed' }, range: 'retention.dueAt' },
  cancelledRetentionDue: { collection: JOBS, scope: 'COLLECTION', equals: { status: 'cancelled' }, range: 'retention.dueAt' },
} as const satisfies Record<string, QueryShape>;

export type SweepQueryName = keyof typeof SWEEP_QUERIES;

export const SWEEP_QUERY_NAMES = Object.keys(SWEEP_QUERIES) as SweepQueryName[];

// ---- Checking the shapes against firestore.indexes.json ------------------------------------------

export interface IndexField {
  readonly fieldPath: string;
  readonly order?: string | undefined;
  readonly arrayConfig?: string | undefined;
}

export interface CompositeIndex {
  readonly collectionGroup: string;
  readonly queryScope: string;
  readonly fields: readonly IndexField[];
}

const DOCUMENT_ID = '__name__';

/**
 * Whether `index` serves `shape`: same collection ID and scope, the equality fields first (in any
 * order), then the range field ascending, and nothing else (an optional trailing `__name__`
 * ascending is what Firestore adds anyway).
 */
export function indexServes(index: CompositeIndex, shape: QueryShape): boolean {
  if (index.collectionGroup !== shape.collection || index.queryScope !== shape.scope) return false;
  const fields = index.fields.filter((field, position) => !(field.fieldPath === DOCUMENT_ID && position === index.fields.length - 1 && field.order === 'ASCENDING'));
  const equality = Object.keys(shape.equals);
  if (fields.length !== equality.length + 1) return false;
  const leading = fields.slice(0, equality.length);
  const equalityCovered =
    leading.every((field) => field.order !== undefined && equality.includes(field.fieldPath)) &&
    new Set(leading.map((field) => field.fieldPath)).size === equality.length;
  const last = fields[equality.length];
  return equalityCovered && last?.fieldPath === shape.range && last.order === 'ASCENDING';
}

/** The names of the declared shapes no index serves, each with what it needs. */
export function missingIndexes(indexes: readonly CompositeIndex[], shapes: Readonly<Record<string, QueryShape>> = SWEEP_QUERIES): string[] {
  return Object.entries(shapes)
    .filter(([, shape]) => !indexes.some((index) => indexServes(index, shape)))
    .map(([name, shape]) => `${name}: ${describeIndex(shape)}`);
}

/** What the index for a shape looks like, in words, for failure messages. */
export function describeIndex(shape: QueryShape): string {
  const fields = [...Object.keys(shape.equals), shape.range].map((field) => `${field} ASCENDING`).join(', ');
  return `${shape.scope} index on ${shape.collection} (${fields})`;
}

/** The index entry a shape needs, in firestore.indexes.json form. */
export function indexFor(shape: QueryShape): CompositeIndex {
  return {
    collectionGroup: shape.collection,
    queryScope: shape.scope,
    fields: [...Object.keys(shape.equals), shape.range].map((fieldPath) => ({ fieldPath, order: 'ASCENDING' })),
  };
}
