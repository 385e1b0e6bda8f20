/**
 * Watching a job: Firestore listeners on the job document and what a frontend shows of it (its
 * timeline, fan-out units, sections, drafts, effects in doubt, and the published answer), read
 * under the project's security rules as the signed-in owner, folded into one typed snapshot that
 * is handed over after every change.
 */
import { collection, doc, limitToLast, onSnapshot, orderBy, query, where, type Firestore, type FirestoreError, type Unsubscribe } from 'firebase/firestore';
import {
  draftsInFlight,
  outboxPath,
  questionOf,
  readDraft,
  readEffect,
  readEvent,
  readJob,
  readResult,
  readSection,
  readUnit,
  TERMINAL_STATUSES,
  type DraftView,
  type EffectView,
  type EventView,
  type JobQuestion,
  type JobView,
  type ResultView,
  type SectionView,
  type UnitView,
} from './job-model';

/** Everything known of a watched job at one moment. */
export interface JobSnapshot {
  readonly jobId: string;
  /** The job document; null until it is first read. */
  readonly job: JobView | null;
  /** The newest events of the timeline, oldest first (at most `timelineLimit`). */
  readonly events: readonly EventView[];
  readonly units: readonly UnitView[];
  /** Every recorded section, in no particular order (sort by `seq` within a phase). */
  readonly sections: readonly SectionView[];
  /** Every draft read, stale ones included; {@link JobSnapshot.writing} is what to show. */
  readonly drafts: readonly DraftView[];
  /** The drafts of sections being written now (client's `draftsInFlight`). */
  readonly writing: readonly DraftView[];
  /** Effects in flight when something went wrong, whose outcome is being checked. */
  readonly unknownEffects: readonly EffectView[];
  /** The question the job waits on its owner to answer, if it does. */
  readonly question: JobQuestion | null;
  /** The published answer, once the job completed. */
  readonly result: ResultView | null;
  /** The job ended: a terminal status and, when completed, its answer read. */
  readonly ended: boolean;
}

/** The parts of a job a watch reads; each one is a listener. */
export const WATCHED_PARTS = ['job', 'events', 'units', 'sections', 'drafts', 'effects', 'result'] as const;

/** One part of a watched job. */
export type WatchedPart = (typeof WATCHED_PARTS)[number];

/** A listener that failed: it is stopped, the others go on. */
export interface WatchError {
  readonly part: WatchedPart;
  /** Firestore's code: `permission-denied` when the job does not exist or is not the caller's. */
  readonly code: string;
  readonly message: string;
}

/** How much a watch reads. */
export interface WatchOptions {
  /** Newest timeline events kept; 200 by default. */
  readonly timelineLimit?: number;
  /** The parts to read beside the job document (which is always read); all of them by default. */
  readonly parts?: readonly Exclude<WatchedPart, 'job'>[];
  /** Called when a listener fails; without it a failure only stops that listener. */
  readonly onError?: (error: WatchError) => void;
}

/** The snapshot of a job nothing has been read of yet. */
export function emptySnapshot(jobId: string): JobSnapshot {
  return { jobId, job: null, events: [], units: [], sections: [], drafts: [], writing: [], unknownEffects: [], question: null, result: null, ended: false };
}

/** The snapshot with its derived fields (`writing`, `question`, `ended`) computed from the read ones. */
export function deriveSnapshot(read: Omit<JobSnapshot, 'writing' | 'question' | 'ended'>): JobSnapshot {
  const { job, sections, drafts, units, result } = read;
  return {
    ...read,
    writing: job ? draftsInFlight(job, sections, drafts, units) : [],
    question: job ? questionOf(job) : null,
    ended: job !== null && TERMINAL_STATUSES.has(job.status) && (job.status !== 'completed' || result !== null),
  };
}

/**
 * Watches a job of the signed-in user: `onChange` gets a new snapshot after every change of any
 * part. Returns the function that stops every listener; after it, `onChange` is not called again.
 * Reads cost one document read per changed document (a streaming draft is one per flush, about a
 * second apart); leave out the parts a view does not show with `parts`.
 */
export function watchJob(db: Firestore, jobId: string, onChange: (snapshot: JobSnapshot) => void, options: WatchOptions = {}): Unsubscribe {
  const parts = new Set<WatchedPart>(['job', ...(options.parts ?? WATCHED_PARTS)]);
  const jobPath = `jobs/${jobId}`;
  let current: Omit<JobSnapshot, 'writing' | 'question' | 'ended'> = emptySnapshot(jobId);
  let stopped = false;
  let watchedOutbox: string | null = null;
  const unsubscribes: Unsubscribe[] = [];

  const update = (change: Partial<typeof current>): void => {
    if (stopped) return;
    current = { ...current, ...change };
    onChange(deriveSnapshot(current));
  };
  const failed = (part: WatchedPart) => (error: FirestoreError) => {
    if (!stopped) options.onError?.({ part, code: error.code, message: error.message });
  };
  const listen = (part: WatchedPart, subscribe: () => Unsubscribe): void => {
    if (parts.has(part)) unsubscribes.push(subscribe());
  };

  listen('job', () =>
    onSnapshot(
      doc(db, jobPath),
      (snapshot) => {
        if (!snapshot.exists()) return;
        const job = readJob(jobId, snapshot.data());
        // The answer is published to the outbox in the same commit that completes the job; its path is known once the job is read.
        const outbox = outboxPath(job);
        if (parts.has('result') && watchedOutbox !== outbox && !stopped) {
          watchedOutbox = outbox;
          unsubscribes.push(
            onSnapshot(
              doc(db, outbox),
              (result) => update({ result: result.exists() ? readResult(result.data()) : null }),
              failed('result'),
            ),
          );
        }
        update({ job });
      },
      failed('job'),
    ),
  );
  listen('events', () =>
    onSnapshot(
      query(collection(db, jobPath, 'events'), orderBy('atMs'), limitToLast(options.timelineLimit ?? 200)),
      (snapshot) => update({ events: snapshot.docs.map((event) => readEvent(event.id, event.data())) }),
      failed('events'),
    ),
  );
  listen('units', () =>
    onSnapshot(collection(db, jobPath, 'units'), (snapshot) => update({ units: snapshot.docs.map((unit) => readUnit(unit.id, unit.data())) }), failed('units')),
  );
  listen('sections', () =>
    onSnapshot(collection(db, jobPath, 'sections'), (snapshot) => update({ sections: snapshot.docs.map((section) => readSection(section.data())) }), failed('sections')),
  );
  listen('drafts', () =>
    onSnapshot(collection(db, jobPath, 'drafts'), (snapshot) => update({ drafts: snapshot.docs.map((draft) => readDraft(draft.data())) }), failed('drafts')),
  );
  listen('effects', () =>
    onSnapshot(
      query(collection(db, jobPath, 'effects'), where('state', '==', 'unknown')),
      (snapshot) => update({ unknownEffects: snapshot.docs.map((effect) => readEffect(effect.id, effect.data())) }),
      failed('effects'),
    ),
  );

  return () => {
    stopped = true;
    for (const unsubscribe of unsubscribes.splice(0)) unsubscribe();
  };
}

/** Options of {@link waitForJob}. */
export interface WaitForJobOptions extends Omit<WatchOptions, 'onError'> {
  /** Stops waiting: the promise rejects with the signal's reason. */
  readonly signal?: AbortSignal;
}

/**
 * Watches a job until `done` holds for a snapshot, then stops watching and resolves with it.
 * Rejects when the job document cannot be read (`permission-denied`: not the caller's, or no such
 * job) or when `signal` aborts. For scripts and tests; a UI keeps {@link watchJob} running.
 */
export function waitForJob(db: Firestore, jobId: string, done: (snapshot: JobSnapshot) => boolean, options: WaitForJobOptions = {}): Promise<JobSnapshot> {
  return new Promise((resolve, reject) => {
    const { signal, ...watchOptions } = options;
    if (signal?.aborted) {
      reject(signal.reason as Error);
      return;
    }
    let settled = false;
    let stop: Unsubscribe | null = null;
    const finish = (outcome: () => void): void => {
      if (settled) return;
      settled = true;
      signal?.removeEventListener('abort', onAbort);
      stop?.();
      outcome();
    };
    const onAbort = (): void => finish(() => reject(signal?.reason as Error));
    stop = watchJob(
      db,
      jobId,
      (snapshot) => {
        if (done(snapshot)) finish(() => resolve(snapshot));
      },
      {
        ...watchOptions,
        onError: (error) => {
          if (error.part === 'job') finish(() => reject(new Error(`Cannot read job ${jobId}: ${error.code}: ${error.message}`)));
        },
      },
    );
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
