/**
 * Reads everything the invariant checker needs from Firestore with the Admin SDK: every job, its
 * subcollections, the published answers, each document with its commit time. Reading is
 * tolerant (a field of the wrong type reads as absent): the checker, not the reader, decides what
 * is wrong, and a malformed document must not hide the rest. The job and unit documents are also
 * decoded as the engine decodes them (store/codec.ts), for the stranded-job check; one that does
 * not decode is kept with the reason.
 */
import type { DocumentSnapshot, Firestore, Timestamp } from 'firebase-admin/firestore';
import type { UnitView } from '../../functions/src/core/invariants';
import type { JobRecord } from '../../functions/src/core/job';
import { decodeJob, decodeUnit } from '../../functions/src/store/codec';
import { EXPIRE_AT, EXPIRING_JOB_COLLECTIONS } from '../../functions/src/store/retention';
import type { CheckpointDoc, CollectedJob, EffectDoc, EventDoc, JobDoc, ResultDoc, SectionDoc, TranscriptDoc, UnitCostDoc } from './model';

/** Microseconds since 1970: exact in a double for the next few centuries. */
export function micros(time: Timestamp | undefined): number {
  if (!time) return Number.NaN;
  return time.seconds * 1_000_000 + Math.floor(time.nanoseconds / 1_000);
}

type Data = Readonly<Record<string, unknown>>;

const text = (value: unknown): string | null => (typeof value === 'string' ? value : null);
const num = (value: unknown, fallback = 0): number => (typeof value === 'number' && Number.isFinite(value) ? value : fallback);
const record = (value: unknown): Data | null => (value !== null && typeof value === 'object' && !Array.isArray(value) ? (value as Data) : null);
const strings = (value: unknown): string[] => (Array.isArray(value) ? value.filter((item): item is string => typeof item === 'string') : []);
const numbers = (value: unknown): Record<string, number> => {
  const out: Record<string, number> = {};
  for (const [name, item] of Object.entries(record(value) ?? {})) if (typeof item === 'number') out[name] = item;
  return out;
};
const millisOf = (value: unknown): number | null => {
  const candidate = value as { toMillis?: unknown } | null;
  return candidate !== null && typeof candidate === 'object' && typeof candidate.toMillis === 'function' ? (candidate.toMillis as () => number)() : null;
};

/**
 * When the engine committed a document. Its update time, except for a document the sweeper's
 * retention pass has stamped (`expireAt`, written 15 minutes after the job ended, or with the
 * document itself when it was written to an ended job): the stamp moves the update time, so such a
 * document counts from its creation. Events, sections and transcript saves are each written once
 * (a save retried after a lost answer rewrites itself, same content), so that is their commit; a
 * rewrite the stamp came after is not seen. Before this, a soak longer than the retention grace
 * read every stamped transcript as a stale write and every stamped timeline out of order.
 */
export function commit(snapshot: Pick<DocumentSnapshot, 'get' | 'createTime' | 'updateTime'>): number {
  const stamped = snapshot.get(EXPIRE_AT) !== undefined;
  return micros(stamped ? snapshot.createTime : snapshot.updateTime);
}

/** The tool call IDs answered in a stored transcript (`transcript.messages`); tolerant of any shape. */
/**
 * What one stored transcript document holds: a whole transcript (a document from before the
 * append-only log) or one save of the log, whose messages are only those it appended.
 */
export function savedTranscriptOf(data: Record<string, unknown> | undefined): Record<string, unknown> | null {
  if (data === undefined) return null;
  if (typeof data.save !== 'number') return record(data.transcript);
  return { ...(record(data.head) ?? {}), messages: Array.isArray(data.messages) ? data.messages : [] };
}

export function toolResultIds(transcript: unknown): string[] {
  const messages = record(transcript)?.messages;
  if (!Array.isArray(messages)) return [];
  return messages.flatMap((message: unknown) => {
    const item = record(message);
    return item?.role === 'tool' && typeof item.toolCallId === 'string' ? [item.toolCallId] : [];
  });
}

const problemOf = (error: unknown): string => (error instanceof Error ? error.message : String(error));

/** The job as the engine reads it, or why the engine could not. */
function decodedJob(snapshot: DocumentSnapshot): { record: JobRecord | null; recordProblem: string | null } {
  try {
    return { record: decodeJob(snapshot.id, snapshot.data()), recordProblem: null };
  } catch (error) {
    return { record: null, recordProblem: problemOf(error) };
  }
}

export function jobDocFrom(data: Data): JobDoc {
  const waiting = record(data.waiting);
  const lastError = record(data.lastError);
  const quarantine = record(data.quarantine);
  const cancellation = record(data.cancellation);
  const effectsSettled = record(cancellation?.effects)?.settled;
  return {
    status: text(data.status) ?? '(none)',
    outcome: text(data.outcome),
    pipeline: text(data.pipeline) ?? '(none)',
    idempotencyKey: text(data.idempotencyKey),
    owner: text(data.owner) ?? '',
    epoch: num(data.epoch, -1),
    staleReclaims: num(data.staleReclaims),
    attempts: num(data.attempts),
    waiting: waiting && {
      reason: text(waiting.reason) ?? '',
      questionId: text(waiting.questionId) ?? '',
      question: text(waiting.question) ?? '',
      options: strings(waiting.options),
      untilMs: millisOf(waiting.until),
    },
    lastError: lastError && { code: text(lastError.code) ?? '', message: text(lastError.message) ?? '' },
    quarantine: quarantine && { reason: text(quarantine.reason) ?? '' },
    cancellation: cancellation && {
      reason: text(cancellation.reason) ?? '',
      effectsSettled: typeof effectsSettled === 'boolean' ? effectsSettled : null,
    },
    cost: numbers(data.cost),
    decisions: Object.fromEntries(Object.entries(record(data.decisions) ?? {}).filter((entry): entry is [string, string] => typeof entry[1] === 'string')),
  };
}

async function collectJob(db: Firestore, snapshot: DocumentSnapshot, messages: readonly ResultDoc[]): Promise<CollectedJob> {
  const ref = snapshot.ref;
  const read = ['events', 'sections', 'checkpoints', 'transcripts', 'effects', 'results', 'units'];
  const [events, sections, checkpoints, transcripts, effects, results, unitDocs] = await Promise.all(read.map((name) => ref.collection(name).get()));
  // The expiring collections not read above, for their stamps only.
  const others = EXPIRING_JOB_COLLECTIONS.filter((name) => !read.includes(name));
  const stampsOnly = await Promise.all(others.map((name) => ref.collection(name).select(EXPIRE_AT).get()));
  const docs = (query: typeof events) => query?.docs ?? [];
  const units: UnitView[] = [];
  const unitCosts: UnitCostDoc[] = [];
  const unitProblems: string[] = [];
  for (const doc of docs(unitDocs)) {
    try {
      const unit = decodeUnit(doc.ref.path, doc.data());
      units.push({ unit: unit.unit, phase: unit.phase, fanoutEpoch: unit.fanoutEpoch, status: unit.status, lease: unit.lease, nextRunAtMs: unit.nextRunAtMs });
      unitCosts.push({ unit: unit.unit, phase: unit.phase, fanoutEpoch: unit.fanoutEpoch, status: unit.status, cost: unit.cost, costInJob: unit.costInJob });
    } catch (error) {
      unitProblems.push(`${doc.id}: ${problemOf(error)}`);
    }
  }
  const stamped = [
    ...(snapshot.get(EXPIRE_AT) !== undefined ? ['.'] : []),
    ...[events, sections, checkpoints, transcripts, effects, results, unitDocs, ...stampsOnly].flatMap((query) =>
      docs(query)
        .filter((doc) => doc.get(EXPIRE_AT) !== undefined)
        .map((doc) => `${doc.ref.parent.id}/${doc.id}`),
    ),
  ];
  return {
    ...decodedJob(snapshot),
    units,
    unitProblems,
    unitCosts,
    stamped,
    id: ref.id,
    job: jobDocFrom(snapshot.data() ?? {}),
    events: docs(events).map(
      (doc): EventDoc => ({ id: doc.id, kind: text(doc.get('kind')) ?? '', epoch: num(doc.get('epoch'), -1), unit: text(doc.get('unit')), commitUs: commit(doc), status: text(doc.get('status')) }),
    ),
    sections: docs(sections).map(
      (doc): SectionDoc => ({
        id: doc.id,
        phase: text(doc.get('phase')) ?? '',
        unit: text(doc.get('unit')),
        sectionId: text(doc.get('id')) ?? '',
        epoch: num(doc.get('epoch'), -1),
        commitUs: commit(doc),
      }),
    ),
    checkpoints: docs(checkpoints).map((doc): CheckpointDoc => ({ phase: doc.id, epoch: num(doc.get('epoch'), -1), commitUs: commit(doc) })),
    transcripts: docs(transcripts).map((doc): TranscriptDoc => {
      const transcript = savedTranscriptOf(doc.data());
      const tally = record(transcript?.tally);
      return {
        id: doc.id,
        phase: text(doc.get('phase')) ?? '',
        unit: text(doc.get('unit')),
        sectionId: text(doc.get('id')) ?? '',
        epoch: num(doc.get('epoch'), -1),
        commitUs: commit(doc),
        generation: num(transcript?.generation),
        modelCalls: num(tally?.modelCalls),
        wastedModelCalls: num(tally?.wastedModelCalls),
        toolResultIds: toolResultIds(transcript),
      };
    }),
    effects: docs(effects).map((doc): EffectDoc => {
      const intent = record(doc.get('intent'));
      return {
        key: doc.id,
        idempotencyKey: text(doc.get('idempotencyKey')) ?? doc.id,
        unit: text(doc.get('unit')),
        state: text(doc.get('state')) ?? '',
        kind: text(intent?.kind) ?? '',
        identity: text(intent?.identity) ?? '',
        epoch: num(doc.get('epoch'), -1),
        commitUs: commit(doc),
        lastOutcome: text(doc.get('lastOutcome')),
        resolution: text(doc.get('resolution')),
      };
    }),
    results: [
      ...docs(results).map((doc): ResultDoc => ({ path: doc.ref.path, outcome: text(doc.get('outcome')), missing: strings(doc.get('missing')), commitUs: commit(doc) })),
      ...messages,
    ],
  };
}

/** Every job in the database, with what hangs off it. */
export async function collectJobs(db: Firestore, concurrency = 8): Promise<CollectedJob[]> {
  const [jobs, messages] = await Promise.all([db.collection('jobs').get(), db.collectionGroup('messages').get()]);
  const byJob = new Map<string, ResultDoc[]>();
  for (const doc of messages.docs) {
    const jobId = text(doc.get('jobId')) ?? doc.id;
    const published: ResultDoc = { path: doc.ref.path, outcome: text(doc.get('outcome')), missing: strings(doc.get('missing')), commitUs: commit(doc) };
    byJob.set(jobId, [...(byJob.get(jobId) ?? []), published]);
  }
  const collected: CollectedJob[] = [];
  const queue = [...jobs.docs];
  const lanes = Array.from({ length: Math.min(concurrency, queue.length) }, async () => {
    for (let doc = queue.shift(); doc; doc = queue.shift()) collected.push(await collectJob(db, doc, byJob.get(doc.id) ?? []));
  });
  await Promise.all(lanes);
  return collected.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}
