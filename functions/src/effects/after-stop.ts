/**
 * Reconciliation after a job stopped (cancelled, failed, quarantined): nobody holds a claim any
 * more, so no worker will settle the effects it left `applying` or `unknown`. This looks each one
 * up in the system of record, records what it finds, and brings the job's counts and cancellation
 * report in line with the ledger, so the report says what the target really has.
 *
 * Its writes are conditioned on the job still being stopped and the entry still unresolved (both
 * read in the same transaction): a stopped job has no owner whose claim could be checked, and no
 * worker can write to it any more (every owner-checked write needs `running`).
 */
import type { Firestore } from 'firebase-admin/firestore';
import type { JobRecord, JobStatus } from '../core/job';
import type { JobStore } from '../store/job-store';
import { effectPath, effectsPath } from '../store/paths';
import { allEffectEntries, parseEffectEntry } from './firestore-ledger';
import { applyChange, countEffectStates, UNRESOLVED_EFFECT_STATES, type EffectChange, type EffectCounts, type EffectEntry } from './ledger';
import type { EffectAdapter } from './port';

export interface StoppedReconcileOptions {
  /**
   * An entry that went unknown more recently than this is left for a later run when the target
   * does not have it: its request may still be on its way. Found entries are recorded at once.
   */
  readonly settleGraceMs?: number;
  /** The pipeline's own progress figures, recomputed from the ledger. */
  readonly progress?: (entries: readonly EffectEntry[]) => Record<string, number>;
  readonly signal?: AbortSignal;
}

export interface StoppedReconcileResult {
  readonly checked: number;
  readonly foundApplied: number;
  readonly notApplied: number;
  readonly stillUnknown: number;
  /** The ledger's states after this run. */
  readonly counts: EffectCounts;
  /** The cancellation report as rewritten, for a cancelled job. */
  readonly report: string | null;
}

const STOPPED: ReadonlySet<JobStatus> = new Set(['cancelled', 'failed', 'quarantined']);
export const DEFAULT_SETTLE_GRACE_MS = 60_000;

/** The sentence cancelJob writes about effects, and the one this rewrites it to. */
const EFFECTS_SENTENCE = /Effects: \d+ applied, \d+ not applied, \d+ unknown[^.]*\./;

export function effectsSentence(counts: EffectCounts, target: string): string {
  const unknown = counts.unknown + counts.applying;
  return (
    `Effects: ${counts.applied} applied, ${counts.planned + counts.failed} not applied, ${unknown} unknown` +
    (unknown > 0 ? ` (could not be checked with ${target} yet).` : ` (checked with ${target}).`)
  );
}

function stoppedCheck(job: JobRecord): string | null {
  return STOPPED.has(job.status) ? null : `Job ${job.id} is ${job.status}: only a stopped job's effects are reconciled from outside`;
}

async function recordOutcome(store: JobStore, jobId: string, key: string, change: EffectChange): Promise<boolean> {
  const db: Firestore = store.db;
  return store.transact(jobId, stoppedCheck, async ({ tx }) => {
    const snapshot = await tx.get(db.doc(effectPath(jobId, key)));
    if (!snapshot.exists) return { value: false };
    const entry = parseEffectEntry(snapshot.ref.path, snapshot.data());
    if (!UNRESOLVED_EFFECT_STATES.includes(entry.state)) return { value: false };
    tx.set(snapshot.ref, applyChange(entry, change, entry.epoch, store.clock.now()));
    return { value: true };
  });
}

export async function reconcileStoppedJob(store: JobStore, adapter: EffectAdapter, jobId: string, options: StoppedReconcileOptions = {}): Promise<StoppedReconcileResult> {
  const job = await store.read(jobId);
  if (!job) throw new Error(`No job ${jobId}`);
  const refusal = stoppedCheck(job);
  if (refusal !== null) throw new Error(refusal);
  const signal = options.signal ?? new AbortController().signal;
  const graceMs = options.settleGraceMs ?? DEFAULT_SETTLE_GRACE_MS;

  const unresolved = (await allEffectEntries(store.db, jobId)).filter((entry) => UNRESOLVED_EFFECT_STATES.includes(entry.state));
  let foundApplied = 0;
  let notApplied = 0;
  let stillUnknown = 0;
  for (const entry of unresolved) {
    const lookup = await adapter.lookup(entry.idempotencyKey, signal);
    const countUnknown = entry.state === 'applying';
    if (lookup.kind === 'found') {
      const written = await recordOutcome(store, jobId, entry.key, {
        state: 'applied',
        evidence: lookup.evidence,
        reconciled: true,
        countLookup: true,
        countUnknown,
        lastOutcome: `found at ${adapter.name} by lookup after the job stopped`,
        resolution: `found applied at ${adapter.name} after the job stopped`,
      });
      if (written) foundApplied += 1;
      continue;
    }
    const sinceMs = entry.unknownSinceMs ?? entry.updatedAtMs;
    if (lookup.kind === 'not-found' && store.clock.now() - sinceMs >= graceMs) {
      const written = await recordOutcome(store, jobId, entry.key, {
        state: 'failed',
        countLookup: true,
        countUnknown,
        lastOutcome: `not found at ${adapter.name} after the job stopped`,
        resolution: `not applied: ${adapter.name} does not have it, and a stopped job does not retry`,
      });
      if (written) notApplied += 1;
      continue;
    }
    stillUnknown += 1;
  }

  return store.transact(jobId, stoppedCheck, async ({ tx, job: current }) => {
    const snapshot = await tx.get(store.db.collection(effectsPath(jobId)));
    const entries = snapshot.docs.map((doc) => parseEffectEntry(doc.ref.path, doc.data()));
    const counts = countEffectStates(entries);
    const sentence = effectsSentence(counts, adapter.name);
    let cancellation = current.cancellation;
    if (cancellation) {
      const report = EFFECTS_SENTENCE.test(cancellation.report) ? cancellation.report.replace(EFFECTS_SENTENCE, sentence) : `${cancellation.report} ${sentence}`;
      cancellation = { ...cancellation, report };
    }
    const next: JobRecord = {
      ...current,
      cancellation,
      progress: options.progress ? { ...current.progress, ...options.progress(entries) } : current.progress,
    };
    const message =
      `Checked ${unresolved.length} effects left unresolved with ${adapter.name}: ${foundApplied} found applied, ` +
      `${notApplied} not applied, ${stillUnknown} still unknown. ${sentence}`;
    return {
      next,
      events: [{ kind: 'effects-reconciled', message }],
      value: { checked: unresolved.length, foundApplied, notApplied, stillUnknown, counts, report: cancellation?.report ?? null },
    };
  });
}

