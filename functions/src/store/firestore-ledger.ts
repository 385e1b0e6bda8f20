/**
 * The effect ledger on Firestore, `jobs/{jobId}/effects/{effectKey}`. Every write goes through the
 * store's door as its holder (`commit`: JobStore.apply with the job or unit claim as owner), so a
 * worker that lost its claim, or a job that was cancelled, cannot move an entry: the commit is
 * conditioned on the holder's record, and an entry moved is rewritten under the update time it was
 * read at (a move by anyone else meanwhile is decided again from a new read). No transaction is
 * held, so a worker that dies between its read and its commit locks nothing. Entries are zod-parsed
 * on every read and every write.
 */
import type { Firestore, Query, Transaction } from 'firebase-admin/firestore';
import { z } from 'zod';
import type { Clock } from '../core/clock';
import { CorruptCheckpointError } from '../core/errors';
import { deriveEffectKey, intentFingerprint } from '../core/effect-keys';
import {
  applyChange,
  effectEntrySchema,
  effectIntentSchema,
  EffectIntentConflictError,
  EffectStateConflictError,
  UNRESOLVED_EFFECT_STATES,
  type EffectEntry,
  type EffectIntent,
  type EffectIntentConflict,
  type EffectLedger,
} from '../core/effect-ledger';
import type { JobRecord } from '../core/job';
import type { Change } from './door';
import { effectPath, effectsPath } from './paths';

/**
 * Commits a change decided from the holder's job record through the door, refused unless the claim
 * still holds; `decide` may run again (a lost race), so it reads what it needs itself.
 */
export type HolderCommit = <T>(decide: (current: { readonly job: JobRecord }) => Change<T> | Promise<Change<T>>) => Promise<T>;

export interface FirestoreLedgerParts {
  readonly db: Firestore;
  readonly jobId: string;
  /** The fan-out unit whose entries these are, or null for the job's own phases. */
  readonly unit: string | null;
  /** The writer's fencing epoch, stored on each entry it writes. */
  readonly epoch: number;
  readonly clock: Clock;
  readonly signal: AbortSignal;
  readonly commit: HolderCommit;
}

/** Entries planned per commit: well inside Firestore's 500 writes per commit. */
const PLAN_CHUNK = 100;

/**
 * The job field the sweeper's stopped-effects pass queries (store/codec.ts `effectsToSettleAtMs`).
 * Set, if unset, in the same commit that first moves an entry to `applying`: whatever stops the job
 * later (a cancel, a failure, a quarantine), its ledger is then checked once it has stopped.
 */
export const EFFECTS_TO_SETTLE_FIELD = 'effectsToSettleAt';

export function parseEffectEntry(path: string, data: unknown): EffectEntry {
  const parsed = effectEntrySchema.safeParse(data);
  if (!parsed.success) throw new CorruptCheckpointError(`Effect ledger entry ${path} is malformed: ${z.prettifyError(parsed.error)}`);
  return parsed.data;
}

export function firestoreEffectLedger(parts: FirestoreLedgerParts): EffectLedger {
  const { db, jobId, unit, epoch, clock, signal, commit } = parts;
  const ref = (key: string) => db.doc(effectPath(jobId, key));
  // Once this step has seen the mark, it stays: only the stopped-effects pass clears it, and only on a stopped job.
  let markedForSettling = false;
  return {
    async entries() {
      const snapshot = await db.collection(effectsPath(jobId)).where('unit', '==', unit).get();
      return snapshot.docs.map((doc) => parseEffectEntry(doc.ref.path, doc.data()));
    },

    async plan(intents) {
      const drafts = intents.map((intent) => {
        const parsed: EffectIntent = effectIntentSchema.parse(intent);
        return { intent: parsed, key: deriveEffectKey(jobId, unit, parsed), intentHash: intentFingerprint(parsed) };
      });
      const keys = new Set(drafts.map((draft) => draft.key));
      if (keys.size !== drafts.length) throw new Error('Two planned effects have the same kind and identity: they would share a key');
      const stored: EffectEntry[] = [];
      for (let start = 0; start < drafts.length; start += PLAN_CHUNK) {
        signal.throwIfAborted();
        const chunk = drafts.slice(start, start + PLAN_CHUNK);
        const written = await commit(async () => {
          const snapshots = await db.getAll(...chunk.map((draft) => ref(draft.key)));
          const nowMs = clock.now();
          const creates: { readonly kind: 'create'; readonly path: string; readonly document: EffectEntry }[] = [];
          const conflicts: EffectIntentConflict[] = [];
          const value = chunk.map((draft, index) => {
            const snapshot = snapshots[index];
            if (snapshot?.exists) {
              // An effect already recorded keeps its intent and state; the same key with another intent is refused, never answered with the recorded one.
              const recorded = parseEffectEntry(snapshot.ref.path, snapshot.data());
              if (recorded.intentHash !== draft.intentHash) conflicts.push({ recorded, planned: draft.intent });
              return recorded;
            }
            const entry = effectEntrySchema.parse({
              key: draft.key,
              idempotencyKey: draft.key,
              jobId,
              unit,
              intent: draft.intent,
              intentHash: draft.intentHash,
              state: 'planned',
              attempts: 0,
              unknowns: 0,
              lookups: 0,
              evidence: null,
              reconciled: false,
              lastOutcome: null,
              question: null,
              resolution: null,
              epoch,
              createdAtMs: nowMs,
              updatedAtMs: nowMs,
            } satisfies EffectEntry);
            creates.push({ kind: 'create', path: ref(draft.key).path, document: entry });
            return entry;
          });
          // Thrown before this chunk commits: none of its entries is written.
          if (conflicts.length > 0) throw new EffectIntentConflictError(conflicts);
          return { documents: creates, value };
        });
        stored.push(...written);
      }
      return stored;
    },

    async find(intent) {
      signal.throwIfAborted();
      const snapshot = await ref(deriveEffectKey(jobId, unit, intent)).get();
      return snapshot.exists ? parseEffectEntry(snapshot.ref.path, snapshot.data()) : null;
    },

    async transition(key, from, change) {
      signal.throwIfAborted();
      const moved = await commit(async ({ job }) => {
        const snapshot = await ref(key).get();
        if (!snapshot.exists || !snapshot.updateTime) throw new EffectStateConflictError(`Effect ${key} of job ${jobId} is not in the ledger`);
        const entry = parseEffectEntry(snapshot.ref.path, snapshot.data());
        if (!from.includes(entry.state)) {
          throw new EffectStateConflictError(`Effect ${key} is ${entry.state}, not ${from.join(' or ')}: the ledger moved under this step`);
        }
        const nowMs = clock.now();
        const next = applyChange(entry, change, epoch, nowMs);
        const marking = change.state === 'applying' && !markedForSettling && (job.effectsToSettleAtMs ?? null) === null;
        return {
          // The job as decided from, marked for the stopped-effects pass in the commit that first sends an effect.
          ...(marking ? { next: { ...job, effectsToSettleAtMs: nowMs } } : {}),
          documents: [{ kind: 'update-read', read: { path: snapshot.ref.path, updateTime: snapshot.updateTime }, fields: next }],
          value: next,
        };
      });
      if (change.state === 'applying') markedForSettling = true;
      return moved;
    },
  };
}

/** Up to `limit` keys of entries whose outcome is unknown (or in flight), read inside `tx`, or plainly without one. */
export async function unresolvedEffectKeys(tx: Transaction | null, db: Firestore, jobId: string, limit = 5): Promise<string[]> {
  const query: Query = db.collection(effectsPath(jobId)).where('state', 'in', [...UNRESOLVED_EFFECT_STATES]).limit(limit);
  return (await (tx ? tx.get(query) : query.get())).docs.map((doc) => doc.id);
}

/** Every entry of a job, all units, validated. */
export async function allEffectEntries(db: Firestore, jobId: string): Promise<EffectEntry[]> {
  const snapshot = await db.collection(effectsPath(jobId)).get();
  return snapshot.docs.map((doc) => parseEffectEntry(doc.ref.path, doc.data()));
}
