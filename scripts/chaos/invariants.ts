/**
 * The soak's invariants, checked over what Firestore and the receiver hold at the end of a run
 * (see model.ts). Pure: every check is a function of the collected documents.
 *
 * Ordering uses Firestore's commit times only. Two facts make them usable as evidence:
 *   - every owner-checked write reads the job (or unit) document in its transaction, and every
 *     claim writes it, so a write and a claim of the same job or unit conflict and Firestore
 *     serialises them: the one that commits first is the one that happened first;
 *   - a document written under fencing epoch e' proves that the claim of epoch e' had been
 *     recorded before that document's commit (the write checked it).
 */
import { strandedReason } from '../../functions/src/core/invariants';
import { ENDED_STATUSES, JOB_STATUSES, type JobStatus } from '../../functions/src/core/job';
import { firstDisallowedMove } from '../../functions/src/core/transitions';
import { failedBecauseStopped } from '../../functions/src/effects/after-stop';
import { UNRESOLVED_EFFECT_STATES } from '../../functions/src/effects/ledger';
import type { CollectedJob, EffectDoc, Observed, OwnedWrite, Submission, ToolExecution } from './model';

export const TERMINAL = new Set(['completed', 'failed', 'cancelled', 'quarantined']);
const TERMINAL_EVENT_KINDS = new Set(['completed', 'failed', 'cancelled', 'quarantined']);

/** The reconciliation after a job stopped writes entries without a claim, by design (effects/after-stop.ts). */
const AFTER_STOP = /after the job stopped$/;

/**
 * Unit events written under a unit's own claim carry its document key and epoch in their ID
 * (store/job-store.ts writeUnitEvents): `u-{14-digit ms}-{phase}~{unit}-{4+ digit epoch}-{12 hex}-{index}`.
 */
export const UNIT_EVENT_ID = /^u-\d{14}-([^~]+)~(.+)-(\d{4,})-[0-9a-f]{12}-\d+$/;

/** Statuses in which no worker will settle an effect any more (effects/after-stop.ts). */
const STOPPED = new Set(['cancelled', 'failed', 'quarantined']);
const UNSETTLED_EFFECT_STATES: ReadonlySet<string> = new Set(UNRESOLVED_EFFECT_STATES);

export interface Violation {
  readonly jobId: string | null;
  readonly detail: string;
}

export type InvariantName =
  | 'submissionsNotAccepted'
  | 'jobsLost'
  | 'duplicateJobs'
  | 'duplicatePublished'
  | 'resultsDisagree'
  | 'duplicateEffects'
  | 'effectsMisreported'
  | 'staleWrites'
  | 'withoutReason'
  | 'redoneAfterCheckpoint'
  | 'stranded'
  | 'unsettledAfterStop'
  | 'toolCallRepeated'
  | 'offTheTable'
  | 'fanOutOutlivedClaim'
  | 'costNotSummed'
  | 'expiryOnLiveJob'
  | 'effectsNeverSent';

export interface InvariantResult {
  readonly name: InvariantName;
  readonly label: string;
  readonly definition: string;
  readonly violations: readonly Violation[];
}

/** A job that did not end completed and whole, with the reason its document gives. */
export interface NotWhole {
  readonly jobId: string;
  readonly pipeline: string;
  readonly state: string;
  readonly reason: string;
}

export interface SoakStats {
  readonly jobs: number;
  readonly notWhole: readonly NotWhole[];
  /** `completed (complete)`, `waiting (decision)`, `failed`, … → count. */
  readonly byState: ReadonlyMap<string, number>;
  readonly sectionsTotal: number;
  readonly sectionsRecomputed: number;
  readonly modelCalls: number;
  readonly toolCalls: number;
  readonly spentUsd: number;
  /** Every `cost.wasted*` counter summed over jobs. */
  readonly wasted: ReadonlyMap<string, number>;
  readonly claims: number;
  readonly reclaims: number;
  readonly retries: number;
  readonly redispatches: number;
  readonly receiverApplications: number;
  readonly receiverApplyRequests: number;
  readonly receiverReplays: number;
  readonly receiverLookups: number;
  /** Answers the receiver's faults produced, by request and outcome: `apply hung`, `lookup 503`, … */
  readonly receiverFaultyAnswers: ReadonlyMap<string, number>;
  readonly effectsByState: ReadonlyMap<string, number>;
  /** Lines in the offline toolbox's execution log, and those whose result was delivered. */
  readonly toolExecutions: number;
  readonly toolExecutionsDelivered: number;
  /** Call IDs that ran more than once (an interrupted result, a worker lost before its save; or a violation above). */
  readonly toolCallsRunMoreThanOnce: number;
  /** (job, call ID) pairs with a recorded result. */
  readonly toolResultsRecorded: number;
  /** Repeatable calls a fenced-out claim ran after a newer claim recorded their result (wasted, not a violation). */
  readonly toolRunsByFencedOutClaims: number;
  /** Log lines that name no claim (the check can then exempt none of them). */
  readonly toolExecutionsWithoutClaim: number;
}

export interface CheckReport {
  readonly invariants: readonly InvariantResult[];
  readonly stats: SoakStats;
}

export const DEFINITIONS: Readonly<Record<InvariantName, { readonly label: string; readonly definition: string }>> = {
  submissionsNotAccepted: {
    label: 'submissions never accepted',
    definition: 'a planned submission for which the client, retrying with the same Idempotency-Key, never got a 202 with a task ID',
  },
  jobsLost: {
    label: 'jobs lost',
    definition:
      'an accepted task ID whose job document is missing at the end, or whose job is neither terminal (completed, failed, cancelled, ' +
      'quarantined) nor waiting with a stated reason (a question, and for a provider wait a resume time)',
  },
  duplicateJobs: {
    label: 'duplicate jobs from retried submits',
    definition: 'one Idempotency-Key answered with two task IDs, or a job document that no accepted submission names',
  },
  duplicatePublished: {
    label: 'duplicate published results',
    definition: 'a job with more than one published answer (results/final and conversation messages together) or more than one `completed` event',
  },
  resultsDisagree: {
    label: 'published results that disagree with the job',
    definition: 'a published answer for a job that is not completed, a completed job without one, or an answer whose outcome differs from the job\'s',
  },
  duplicateEffects: {
    label: 'duplicate effects',
    definition:
      'the receiver applied one idempotency key more than once, or applied the same effect of one job (its kind and identity) under two keys',
  },
  effectsMisreported: {
    label: 'effects the ledger misreports',
    definition:
      'a ledger entry `applied` that the receiver never applied, or a receiver application whose ledger entry says `planned` or `failed` ' +
      '(or that no ledger entry records)',
  },
  staleWrites: {
    label: 'stale writes that landed',
    definition:
      'an owned write (section, phase checkpoint, transcript, effect entry, unit event) of a job or a fan-out unit carrying fencing epoch e, ' +
      'whose Firestore commit time is later than the commit of evidence that the same job or unit had been claimed at an epoch above e ' +
      '(the job\'s `claimed` event, or any owned write of that job or unit with a higher epoch); or any owned write or published answer ' +
      'committed after the job\'s terminal event (completed, failed, cancelled, quarantined)',
  },
  withoutReason: {
    label: 'jobs without a stated reason',
    definition:
      'a job document left queued or running, waiting without a question (or a provider wait without a resume time), failed without ' +
      'lastError, quarantined without quarantine.reason, cancelled without cancellation, or completed `partial` without the missing parts named',
  },
  redoneAfterCheckpoint: {
    label: 'sections redone after their checkpoint',
    definition:
      'a section transcript saved (committed) after the section document it produced, or, for a section without its own document, after ' +
      'its phase checkpoint: checkpointed work that ran again',
  },
  stranded: {
    label: 'stranded jobs (nothing will ever move them)',
    definition:
      'a job for which core/invariants.ts strandedReason, run over its document and its fan-out units as the engine decodes them, gives ' +
      'a reason: not terminal, and neither leased, nor in a fan-out with a queued or leased unit, nor queued or waiting with a due time ' +
      'that a task or the sweeper acts on; or a job (or, for a job not terminal, a unit) document the engine cannot decode',
  },
  unsettledAfterStop: {
    label: "stopped jobs' effects unsettled after the grace period",
    definition:
      'a job that ended cancelled, failed or quarantined with an effect ledger entry still `applying` or `unknown`, or whose cancellation ' +
      'record still says its effects are unsettled, read after the settle grace period (effects/after-stop.ts) has passed for every job ' +
      'and a sweep has settled stopped jobs\' effects (engine/settle-stopped.ts)',
  },
  offTheTable: {
    label: 'job timelines that leave the lifecycle table',
    definition:
      "a job whose events, in commit order, record a change of status the transition table (core/transitions.ts) does not allow, " +
      'e.g. completed → running or queued → completed',
  },
  fanOutOutlivedClaim: {
    label: 'fan-outs that outlived the claim that started them',
    definition:
      'a job document whose `fanout` is set while the job is not `running` at the fan-out\'s own epoch (`fanout.epoch` = the job\'s ' +
      '`epoch`); or an event a fan-out unit wrote (`unit` set) carrying a job epoch e under which no `fanned-out` event was committed ' +
      'before it, or committed after an event of epoch e that left the job in a status other than `running` (the fan-out had ended)',
  },
  costNotSummed: {
    label: "jobs whose cost is not the sum of its parts",
    definition:
      'per cost counter (spentUsd, modelCalls, …), as the engine decodes the documents: a unit whose `costInJob` (the part of its cost ' +
      'added to the job) exceeds its `cost`, or falls short of it once the unit is done or is not in the fan-out the job is running ' +
      '(a cost its fan-out ended without counting); or a job whose `cost` is less than its units\' `costInJob` plus its last job claim\'s ' +
      'running tally (`claimTally.cost`). The spend of the job\'s earlier claims is in its `cost` and recorded nowhere else, so the ' +
      'job-level comparison is a lower bound, not an equality (1e-9 relative tolerance for sums of dollars)',
  },
  expiryOnLiveJob: {
    label: 'expiry stamps on jobs that have not ended',
    definition:
      'a document of a job that is not completed, failed or cancelled (the job document, or one under it: transcripts, events, drafts, ' +
      'artifacts, artifactChunks, setAside, sections, checkpoints, effects, results, units) carrying `expireAt`, which TTL would delete',
  },
  effectsNeverSent: {
    label: 'effects requested and never sent',
    definition:
      'a ledger entry of a completed job that the receiver never applied, left `planned`, `applying` or `unknown` with no resolution ' +
      '(nobody settled it), or `failed` only because the job had stopped once (written off by the stopped-effects pass, then the job ' +
      'ran on). Entries settled as not applied with a reason (failed: refused by the receiver or given up on; a person\'s stop) are not ' +
      'counted; an entry `applied` that the receiver never applied is counted under effects the ledger misreports; a cancelled or ' +
      "failed job's entries never started are not applied by design, and its in-flight ones count under stopped jobs' effects unsettled",
  },
  toolCallRepeated: {
    label: 'tool calls run again after their result was recorded',
    definition:
      'an execution of a tool call ID (the offline toolbox\'s execution log, every worker process) that began after a transcript version ' +
      'holding that call\'s result was committed (seen by the soak\'s transcript listener, or the final transcript); or a call ID whose ' +
      'result two jobs recorded (their executions could not be told apart). Runs before the result was recorded (an interrupted ' +
      'result, a worker lost between the tool and the save) are at-least-once work and not counted; nor is a run of a repeatable call ' +
      '(no external effect, as the toolbox says) by a claim of the same job or unit older than another that ran the call: a claim ' +
      'already fenced out (as a rule it ran the call beside the save of its own model answer, which the fence refused), reported as ' +
      'wasted. Runs are told apart by call ID, unit and epoch: the soak gives every job prompts of its own',
  },
};

function result(name: InvariantName, violations: readonly Violation[]): InvariantResult {
  return { name, ...DEFINITIONS[name], violations };
}

const isWaitingWithReason = (job: CollectedJob['job']): boolean =>
  job.status === 'waiting' &&
  job.waiting !== null &&
  job.waiting.question.trim() !== '' &&
  (job.waiting.reason === 'decision' ? job.waiting.options.length > 0 : job.waiting.untilMs !== null);

// ---- Submissions ------------------------------------------------------------------------------

function checkSubmissions(submissions: readonly Submission[], jobs: ReadonlyMap<string, CollectedJob>) {
  const notAccepted: Violation[] = [];
  const lost: Violation[] = [];
  const duplicates: Violation[] = [];
  const accepted = new Set<string>();
  const keyToTask = new Map<string, string>();
  for (const submission of submissions) {
    const distinct = [...new Set(submission.taskIds)];
    if (distinct.length === 0) {
      notAccepted.push({ jobId: null, detail: `submission ${submission.index} (${submission.pipeline}): ${submission.failure ?? 'no 202 answer'}` });
      continue;
    }
    if (distinct.length > 1) duplicates.push({ jobId: distinct[0] ?? null, detail: `key ${submission.idempotencyKey} answered with ${distinct.join(', ')}` });
    for (const taskId of distinct) {
      accepted.add(taskId);
      keyToTask.set(submission.idempotencyKey, taskId);
      const collected = jobs.get(taskId);
      if (!collected) {
        lost.push({ jobId: taskId, detail: `submission ${submission.index}: accepted, but there is no job document` });
        continue;
      }
      const { job } = collected;
      if (!TERMINAL.has(job.status) && !isWaitingWithReason(job)) {
        lost.push({ jobId: taskId, detail: `submission ${submission.index}: ${job.status} at the end, not terminal and not waiting with a reason` });
      }
    }
  }
  for (const collected of jobs.values()) {
    if (accepted.has(collected.id)) continue;
    const key = collected.job.idempotencyKey;
    const named = key === null ? undefined : keyToTask.get(key);
    duplicates.push({
      jobId: collected.id,
      detail: named ? `a second job for Idempotency-Key ${key ?? ''} (the client was given ${named})` : 'a job no accepted submission names',
    });
  }
  return { notAccepted, lost, duplicates };
}

// ---- Results ----------------------------------------------------------------------------------

function checkResults(jobs: readonly CollectedJob[]) {
  const duplicates: Violation[] = [];
  const disagree: Violation[] = [];
  for (const { id, job, results, events } of jobs) {
    const completedEvents = events.filter((event) => event.kind === 'completed').length;
    if (results.length > 1) duplicates.push({ jobId: id, detail: `${results.length} published answers: ${results.map((item) => item.path).join(', ')}` });
    if (completedEvents > 1) duplicates.push({ jobId: id, detail: `${completedEvents} completed events` });
    if (job.status !== 'completed' && results.length > 0) disagree.push({ jobId: id, detail: `published answer for a ${job.status} job` });
    if (job.status === 'completed' && results.length === 0) disagree.push({ jobId: id, detail: 'completed without a published answer' });
    for (const published of results) {
      if (job.status === 'completed' && published.outcome !== job.outcome) {
        disagree.push({ jobId: id, detail: `answer says ${published.outcome ?? 'no outcome'}, job says ${job.outcome ?? 'no outcome'}` });
      }
    }
  }
  return { duplicates, disagree };
}

// ---- Effects ----------------------------------------------------------------------------------

function checkEffects(observed: Observed) {
  const duplicates: Violation[] = [];
  const misreported: Violation[] = [];
  const ledger = new Map<string, { jobId: string; effect: EffectDoc }>();
  for (const { id, effects } of observed.jobs) for (const effect of effects) ledger.set(effect.idempotencyKey, { jobId: id, effect });

  const perKey = new Map<string, number>();
  for (const application of observed.receiver.applications) perKey.set(application.key, (perKey.get(application.key) ?? 0) + 1);
  for (const [key, count] of perKey) {
    if (count > 1) duplicates.push({ jobId: ledger.get(key)?.jobId ?? null, detail: `key ${key} applied ${count} times` });
  }

  const perIdentity = new Map<string, Set<string>>();
  for (const application of observed.receiver.applications) {
    const entry = ledger.get(application.key);
    if (!entry) {
      misreported.push({ jobId: null, detail: `receiver applied key ${application.key} (${application.kind}), which no ledger entry records` });
      continue;
    }
    const identity = `${entry.jobId}\u0000${application.kind}\u0000${application.identity ?? entry.effect.identity}`;
    perIdentity.set(identity, new Set([...(perIdentity.get(identity) ?? []), application.key]));
    if (entry.effect.state === 'planned' || entry.effect.state === 'failed') {
      misreported.push({ jobId: entry.jobId, detail: `${entry.effect.kind} ${entry.effect.identity}: the receiver applied it, the ledger says ${entry.effect.state}` });
    }
  }
  for (const [identity, keys] of perIdentity) {
    if (keys.size > 1) {
      const [jobId = null, kind = '', what = ''] = identity.split('\u0000');
      duplicates.push({ jobId, detail: `${kind} ${what} applied under ${keys.size} keys` });
    }
  }
  for (const [key, { jobId, effect }] of ledger) {
    if (effect.state === 'applied' && !perKey.has(key)) {
      misreported.push({ jobId, detail: `${effect.kind} ${effect.identity}: the ledger says applied, the receiver never applied key ${key}` });
    }
  }
  return { duplicates, misreported };
}

// ---- Stale writes -----------------------------------------------------------------------------

/** A unit's claim scope: its document key under `units/` (store/paths.ts), one epoch sequence each. */
const unitScope = (phase: string, unit: string): string => `${phase}~${unit}`;

/** Every document of a job written under a claim, with the claim's scope and epoch. */
export function ownedWrites(collected: CollectedJob): OwnedWrite[] {
  const writes: OwnedWrite[] = [];
  const scopeOf = (phase: string, unit: string | null): string | null => (unit === null ? null : unitScope(phase, unit));
  for (const section of collected.sections) {
    writes.push({ collection: 'sections', id: section.id, unit: scopeOf(section.phase, section.unit), epoch: section.epoch, commitUs: section.commitUs });
  }
  for (const checkpoint of collected.checkpoints) writes.push({ collection: 'checkpoints', id: checkpoint.phase, unit: null, epoch: checkpoint.epoch, commitUs: checkpoint.commitUs });
  for (const transcript of collected.transcripts) {
    writes.push({ collection: 'transcripts', id: transcript.id, unit: scopeOf(transcript.phase, transcript.unit), epoch: transcript.epoch, commitUs: transcript.commitUs });
  }
  for (const event of collected.events) {
    const match = UNIT_EVENT_ID.exec(event.id);
    if (match?.[1] !== undefined && match[2] !== undefined && match[3] !== undefined) {
      writes.push({ collection: 'events', id: event.id, unit: unitScope(match[1], match[2]), epoch: Number(match[3]), commitUs: event.commitUs });
    }
  }
  // An effect entry names its unit but not the phase: it joins that unit's scope when one phase has a unit of that name.
  const phasesOf = new Map<string, Set<string>>();
  for (const write of writes) {
    if (write.unit === null) continue;
    const [phase = '', unit = ''] = write.unit.split('~');
    phasesOf.set(unit, new Set([...(phasesOf.get(unit) ?? []), phase]));
  }
  for (const effect of collected.effects) {
    if (effect.lastOutcome !== null && AFTER_STOP.test(effect.lastOutcome)) continue;
    const phases = effect.unit === null ? [] : [...(phasesOf.get(effect.unit) ?? [])];
    const unit = effect.unit === null ? null : phases.length === 1 ? unitScope(phases[0] ?? '', effect.unit) : unitScope('?', effect.unit);
    writes.push({ collection: 'effects', id: effect.key, unit, epoch: effect.epoch, commitUs: effect.commitUs });
  }
  return writes;
}

const scopeName = (unit: string | null): string => (unit === null ? 'job' : `unit ${unit}`);

function checkStaleWrites(jobs: readonly CollectedJob[]): Violation[] {
  const violations: Violation[] = [];
  for (const collected of jobs) {
    const writes = ownedWrites(collected);
    // Evidence of claims, per scope: the job's claimed events, and every owned write itself.
    const evidence = new Map<string, { epoch: number; commitUs: number; what: string }[]>();
    const add = (unit: string | null, item: { epoch: number; commitUs: number; what: string }): void => {
      const scope = unit ?? '';
      evidence.set(scope, [...(evidence.get(scope) ?? []), item]);
    };
    for (const event of collected.events) {
      if (event.kind === 'claimed' && event.unit === null) add(null, { epoch: event.epoch, commitUs: event.commitUs, what: `claimed event ${event.id}` });
    }
    for (const write of writes) add(write.unit, { epoch: write.epoch, commitUs: write.commitUs, what: `${write.collection}/${write.id}` });
    for (const list of evidence.values()) list.sort((a, b) => a.commitUs - b.commitUs);

    for (const write of writes) {
      const list = evidence.get(write.unit ?? '') ?? [];
      // The highest epoch proven before this write committed.
      let newest: { epoch: number; commitUs: number; what: string } | null = null;
      for (const item of list) {
        if (item.commitUs >= write.commitUs) break;
        if (newest === null || item.epoch > newest.epoch) newest = item;
      }
      if (newest !== null && newest.epoch > write.epoch) {
        violations.push({
          jobId: collected.id,
          detail:
            `${write.collection}/${write.id} (${scopeName(write.unit)}, epoch ${write.epoch}) committed at ${write.commitUs} µs, ` +
            `after ${newest.what} proved epoch ${newest.epoch} at ${newest.commitUs} µs`,
        });
      }
    }

    const terminal = collected.events.filter((event) => TERMINAL_EVENT_KINDS.has(event.kind)).sort((a, b) => a.commitUs - b.commitUs)[0];
    if (terminal) {
      for (const write of writes) {
        if (write.commitUs > terminal.commitUs) {
          violations.push({ jobId: collected.id, detail: `${write.collection}/${write.id} (epoch ${write.epoch}) committed after the job's ${terminal.kind} event` });
        }
      }
      for (const published of collected.results) {
        if (published.commitUs > terminal.commitUs) violations.push({ jobId: collected.id, detail: `${published.path} published after the job's ${terminal.kind} event` });
      }
    }
  }
  return violations;
}

// ---- Reasons ----------------------------------------------------------------------------------

function checkReasons(jobs: readonly CollectedJob[]): Violation[] {
  const violations: Violation[] = [];
  for (const { id, job, results } of jobs) {
    const problem = ((): string | null => {
      switch (job.status) {
        case 'queued':
        case 'running':
          return `left ${job.status}`;
        case 'waiting':
          return isWaitingWithReason(job) ? null : 'waiting without a question (or a provider wait without a resume time)';
        case 'failed':
          return job.lastError && job.lastError.message.trim() !== '' ? null : 'failed without lastError';
        case 'quarantined':
          return job.quarantine && job.quarantine.reason.trim() !== '' ? null : 'quarantined without a reason';
        case 'cancelled':
          return job.cancellation ? null : 'cancelled without a cancellation record';
        case 'completed':
          if (job.outcome === 'partial' && !results.some((published) => published.missing.length > 0)) return 'completed partial without the missing parts named';
          if (job.outcome !== 'partial' && job.outcome !== 'complete') return `completed with outcome ${job.outcome ?? 'none'}`;
          return null;
        default:
          return `unknown status ${job.status}`;
      }
    })();
    if (problem !== null) violations.push({ jobId: id, detail: problem });
  }
  return violations;
}

function checkRedone(jobs: readonly CollectedJob[]): Violation[] {
  const violations: Violation[] = [];
  for (const { id, transcripts, sections, checkpoints } of jobs) {
    for (const transcript of transcripts) {
      const section = sections.find((item) => item.phase === transcript.phase && item.unit === transcript.unit && item.sectionId === transcript.sectionId);
      const checkpoint = checkpoints.find((item) => item.phase === transcript.phase);
      const boundary = section
        ? { commitUs: section.commitUs, what: `section ${section.id}` }
        : checkpoint
          ? { commitUs: checkpoint.commitUs, what: `checkpoint ${checkpoint.phase}` }
          : null;
      if (boundary && transcript.commitUs > boundary.commitUs) {
        violations.push({ jobId: id, detail: `transcript ${transcript.id} saved after ${boundary.what} was committed` });
      }
    }
  }
  return violations;
}

// ---- Timelines against the lifecycle table ----------------------------------------------------

/** Job-level events (a unit's own events carry the job's status unchanged) in commit order, checked move by move. */
export function checkTimelines(jobs: readonly CollectedJob[]): Violation[] {
  const violations: Violation[] = [];
  for (const collected of jobs) {
    const statuses = [...collected.events]
      .sort((a, b) => a.commitUs - b.commitUs || a.id.localeCompare(b.id))
      .map((event) => event.status ?? null)
      .filter((status): status is JobStatus => status !== null && (JOB_STATUSES as readonly string[]).includes(status));
    const move = firstDisallowedMove(statuses);
    if (move !== null) violations.push({ jobId: collected.id, detail: `its timeline goes ${move.from} → ${move.to} (event ${move.index + 1}), which the lifecycle table does not allow` });
  }
  return violations;
}

// ---- Stranded jobs -----------------------------------------------------------------------------

function checkStranded(jobs: readonly CollectedJob[]): Violation[] {
  const violations: Violation[] = [];
  for (const collected of jobs) {
    const { record } = collected;
    if (record === null) {
      violations.push({ jobId: collected.id, detail: `the job document does not decode, so nothing can claim it: ${collected.recordProblem ?? 'no reason given'}` });
      continue;
    }
    const reason = strandedReason(record, collected.units);
    if (reason !== null) violations.push({ jobId: collected.id, detail: `${record.status}: ${reason}` });
    if (!TERMINAL.has(record.status)) {
      for (const problem of collected.unitProblems) violations.push({ jobId: collected.id, detail: `a unit document does not decode, so nothing can claim it: ${problem}` });
    }
  }
  return violations;
}

// ---- Effects of stopped jobs ------------------------------------------------------------------

function checkUnsettledAfterStop(jobs: readonly CollectedJob[]): Violation[] {
  const violations: Violation[] = [];
  for (const { id, job, effects } of jobs) {
    if (!STOPPED.has(job.status)) continue;
    const unsettled = effects.filter((effect) => UNSETTLED_EFFECT_STATES.has(effect.state));
    for (const effect of unsettled) {
      violations.push({ jobId: id, detail: `${job.status} job: ${effect.kind} ${effect.identity} (${effect.key}) still ${effect.state}: ${effect.lastOutcome ?? 'no outcome recorded'}` });
    }
    if (unsettled.length === 0 && job.cancellation?.effectsSettled === false) {
      violations.push({ jobId: id, detail: `${job.status} job: its cancellation record still says its effects are unsettled, and no ledger entry is` });
    }
  }
  return violations;
}

// ---- Fan-outs and their claims -----------------------------------------------------------------

function checkFanOutClaims(jobs: readonly CollectedJob[]): Violation[] {
  const violations: Violation[] = [];
  for (const collected of jobs) {
    const { record } = collected;
    const fanout = record?.fanout ?? null;
    if (record && fanout !== null && (record.status !== 'running' || fanout.epoch !== record.epoch)) {
      violations.push({ jobId: collected.id, detail: `its fan-out of ${fanout.phase} (epoch ${fanout.epoch}) is still set on a ${record.status} job at epoch ${record.epoch}` });
    }
    const timeline = [...collected.events].sort((a, b) => a.commitUs - b.commitUs || a.id.localeCompare(b.id));
    for (const event of timeline) {
      if (event.unit === null || event.epoch < 0) continue;
      const started = timeline.filter((item) => item.kind === 'fanned-out' && item.unit === null && item.epoch === event.epoch && item.commitUs <= event.commitUs).at(-1);
      if (started === undefined) {
        violations.push({ jobId: collected.id, detail: `unit ${event.unit}'s ${event.kind} event ${event.id} carries epoch ${event.epoch}, under which no fan-out had started` });
        continue;
      }
      const left = timeline.find(
        (item) => item.epoch === event.epoch && item.commitUs > started.commitUs && item.commitUs < event.commitUs && typeof item.status === 'string' && item.status !== 'running',
      );
      if (left !== undefined) {
        violations.push({ jobId: collected.id, detail: `unit ${event.unit}'s ${event.kind} event ${event.id} (epoch ${event.epoch}) committed after ${left.kind} event ${left.id} left the job ${left.status ?? ''}` });
      }
    }
  }
  return violations;
}

// ---- Cost ------------------------------------------------------------------------------------

/** Sums of dollars differ in their last bits by the order they were added in. */
const costsDiffer = (larger: number, smaller: number): boolean => larger - smaller > 1e-9 * Math.max(1, Math.abs(larger), Math.abs(smaller));

function checkCosts(jobs: readonly CollectedJob[]): Violation[] {
  const violations: Violation[] = [];
  for (const collected of jobs) {
    const { record } = collected;
    if (record === null) continue; // the stranded check reports a job that does not decode
    const fanout = record.status === 'running' ? record.fanout : null;
    const parts: Record<string, number> = { ...(record.claimTally?.cost ?? {}) };
    for (const unit of collected.unitCosts) {
      const counting = unit.status !== 'done' && fanout !== null && unit.phase === fanout.phase && unit.fanoutEpoch === fanout.epoch;
      for (const key of new Set([...Object.keys(unit.cost), ...Object.keys(unit.costInJob)])) {
        const spent = unit.cost[key] ?? 0;
        const counted = unit.costInJob[key] ?? 0;
        parts[key] = (parts[key] ?? 0) + counted;
        if (costsDiffer(counted, spent)) violations.push({ jobId: collected.id, detail: `unit ${unit.phase}~${unit.unit}: ${counted} of ${key} counted in the job, more than its cost of ${spent}` });
        else if (!counting && costsDiffer(spent, counted)) {
          violations.push({ jobId: collected.id, detail: `unit ${unit.phase}~${unit.unit} (${unit.status}, fan-out epoch ${unit.fanoutEpoch}): ${key} ${spent} spent, only ${counted} reached the job's cost` });
        }
      }
    }
    for (const [key, sum] of Object.entries(parts)) {
      const total = record.cost[key] ?? 0;
      if (costsDiffer(sum, total)) violations.push({ jobId: collected.id, detail: `the job's ${key} is ${total}, less than its parts: ${sum} (its units' counted cost and its last claim's tally)` });
    }
  }
  return violations;
}

// ---- Retention stamps on live jobs -------------------------------------------------------------

function checkExpiryOnLiveJobs(jobs: readonly CollectedJob[]): Violation[] {
  const violations: Violation[] = [];
  for (const { id, job, stamped } of jobs) {
    if (ENDED_STATUSES.has(job.status as JobStatus) || stamped.length === 0) continue;
    const shown = stamped.slice(0, 3).join(', ');
    violations.push({ jobId: id, detail: `${job.status} job: ${stamped.length} document(s) carry expireAt (${shown}${stamped.length > 3 ? ', …' : ''})` });
  }
  return violations;
}

// ---- Effects requested and never sent ----------------------------------------------------------

function checkNeverSent(observed: Observed): Violation[] {
  const violations: Violation[] = [];
  const applied = new Set(observed.receiver.applications.map((application) => application.key));
  for (const { id, job, effects } of observed.jobs) {
    if (job.status !== 'completed') continue;
    // notify logs a message to the customer's record only once it was sent: an item whose send failed keeps its record planned, by design.
    const failedSends = new Set(effects.filter((effect) => effect.kind === 'message' && effect.state === 'failed').map((effect) => effect.identity));
    for (const effect of effects) {
      if (effect.state === 'applied' || applied.has(effect.idempotencyKey)) continue;
      if (effect.kind === 'record' && effect.state === 'planned' && failedSends.has(effect.identity)) continue;
      const failed = effect.state === 'failed';
      const writtenOff = failed && failedBecauseStopped({ state: 'failed', resolution: effect.resolution });
      // Settled as not applied with its reason recorded: refused by the receiver, given up on, or stopped by a person.
      if (!writtenOff && (failed || effect.resolution !== null)) continue;
      const why = writtenOff ? `failed (${effect.resolution ?? ''})` : effect.state;
      violations.push({ jobId: id, detail: `completed job: ${effect.kind} ${effect.identity} (${effect.key}) is ${why}, and the receiver never applied it` });
    }
  }
  return violations;
}

// ---- Tool calls -------------------------------------------------------------------------------

interface RecordedResult {
  readonly transcript: string;
  readonly commitUs: number;
}

/** For each call ID, the earliest recorded result per job: the listener's sightings and the final transcripts. */
function recordedResults(observed: Observed): Map<string, Map<string, RecordedResult>> {
  const byCall = new Map<string, Map<string, RecordedResult>>();
  const add = (callId: string, jobId: string, result: RecordedResult): void => {
    const perJob = byCall.get(callId) ?? new Map<string, RecordedResult>();
    const known = perJob.get(jobId);
    if (known === undefined || result.commitUs < known.commitUs) perJob.set(jobId, result);
    byCall.set(callId, perJob);
  };
  for (const seen of observed.toolResultsSeen) add(seen.callId, seen.jobId, { transcript: seen.transcript, commitUs: seen.commitUs });
  for (const { id, transcripts } of observed.jobs) {
    for (const transcript of transcripts) for (const callId of transcript.toolResultIds) add(callId, id, { transcript: transcript.id, commitUs: transcript.commitUs });
  }
  return byCall;
}

function executionsByCall(executions: readonly ToolExecution[]): Map<string, ToolExecution[]> {
  const byCall = new Map<string, ToolExecution[]>();
  for (const execution of executions) byCall.set(execution.callId, [...(byCall.get(execution.callId) ?? []), execution]);
  for (const list of byCall.values()) list.sort((a, b) => a.startedAtMs - b.startedAtMs);
  return byCall;
}

interface RunsAfterRecord {
  readonly jobId: string;
  readonly callId: string;
  readonly recorded: RecordedResult;
  readonly runs: readonly ToolExecution[];
  /** Runs that began after the record, by a claim that could have produced the result again. */
  readonly repeated: readonly ToolExecution[];
  /** Runs that began after the record by a claim already fenced out (ranByFencedOutClaim): wasted, not repeated. */
  readonly wasted: readonly ToolExecution[];
}

/** Every recorded call with the runs that began after its record; a call ID recorded by two jobs is reported on its own. */
function runsAfterRecords(observed: Observed): { readonly calls: RunsAfterRecord[]; readonly ambiguous: Violation[] } {
  const calls: RunsAfterRecord[] = [];
  const ambiguous: Violation[] = [];
  const executions = executionsByCall(observed.toolExecutions);
  for (const [callId, perJob] of recordedResults(observed)) {
    if (perJob.size > 1) {
      ambiguous.push({ jobId: null, detail: `call ID ${callId} has a recorded result in jobs ${[...perJob.keys()].join(', ')}: its executions cannot be told apart` });
      continue;
    }
    const [jobId, recorded] = [...perJob][0] ?? [];
    if (jobId === undefined || recorded === undefined) continue;
    const runs = executions.get(callId) ?? [];
    // Milliseconds against microseconds: an execution counts as later only from the next whole millisecond.
    const later = runs.filter((run) => run.startedAtMs * 1_000 > recorded.commitUs);
    const wasted = later.filter((run) => ranByFencedOutClaim(run, runs));
    calls.push({ jobId, callId, recorded, runs, repeated: later.filter((run) => !wasted.includes(run)), wasted });
  }
  return { calls, ambiguous };
}

/**
 * A run after the record by a claim already fenced out: the call is repeatable (no external effect)
 * and a newer claim of the same job or unit ran it too. Such a worker had the call
 * from its own model answer, ran it beside that answer's save (which the fence then refused) and
 * writes nothing of it: spend wasted, not a result produced again.
 */
function ranByFencedOutClaim(run: ToolExecution, runs: readonly ToolExecution[]): boolean {
  const claim = run.claim;
  if (run.repeatable !== true || claim === undefined) return false;
  // Where the newer claim's run began after the record, that run is itself counted as a repeat.
  return runs.some((other) => other.claim !== undefined && other.claim.unit === claim.unit && other.claim.epoch > claim.epoch);
}

function checkToolCalls(observed: Observed): Violation[] {
  const { calls, ambiguous } = runsAfterRecords(observed);
  const violations = [...ambiguous];
  for (const call of calls) {
    const first = call.repeated[0];
    if (first === undefined) continue;
    violations.push({
      jobId: call.jobId,
      detail:
        `${first.tool} call ${call.callId} ran ${call.repeated.length} more time(s) after transcript ${call.recorded.transcript} recorded its result at ${call.recorded.commitUs} µs ` +
        `(first at ${first.startedAtMs * 1_000} µs in process ${first.pid}${claimLabel(first)}; ${call.runs.length} executions in all)`,
    });
  }
  return violations;
}

function claimLabel(run: ToolExecution): string {
  if (run.claim === undefined) return '';
  return `, claim ${run.claim.unit === null ? 'job' : `unit ${run.claim.unit}`} epoch ${run.claim.epoch}`;
}

// ---- Statistics -------------------------------------------------------------------------------

export function stateLabel(job: CollectedJob['job']): string {
  if (job.status === 'completed') return `completed (${job.outcome ?? '?'})`;
  if (job.status === 'waiting') return `waiting (${job.waiting?.reason ?? '?'})`;
  return job.status;
}

function reasonOf(collected: CollectedJob): string {
  const { job } = collected;
  switch (job.status) {
    case 'completed':
      return `missing: ${collected.results.flatMap((published) => published.missing).join('; ') || '(not named)'}`;
    case 'failed':
      return job.lastError ? `${job.lastError.code}: ${job.lastError.message}` : '(no lastError)';
    case 'quarantined':
      return job.quarantine?.reason ?? '(no reason)';
    case 'cancelled':
      return job.cancellation?.reason ?? '(no cancellation)';
    case 'waiting':
      return job.waiting ? `${job.waiting.questionId}: ${job.waiting.question}` : '(no question)';
    default:
      return job.lastError ? `last error ${job.lastError.code}: ${job.lastError.message}` : '';
  }
}

function statistics(observed: Observed): SoakStats {
  const byState = new Map<string, number>();
  const notWhole: NotWhole[] = [];
  const wasted = new Map<string, number>();
  const effectsByState = new Map<string, number>();
  let sectionsTotal = 0;
  let sectionsRecomputed = 0;
  let modelCalls = 0;
  let toolCalls = 0;
  let spentUsd = 0;
  let claims = 0;
  let reclaims = 0;
  let retries = 0;
  let redispatches = 0;
  for (const collected of observed.jobs) {
    const label = stateLabel(collected.job);
    byState.set(label, (byState.get(label) ?? 0) + 1);
    if (!(collected.job.status === 'completed' && collected.job.outcome === 'complete')) {
      notWhole.push({ jobId: collected.id, pipeline: collected.job.pipeline, state: label, reason: reasonOf(collected) });
    }
    // A section's transcript is a log of saves: counted once, recomputed when any save says so.
    const recomputedBySection = new Map<string, boolean>();
    for (const transcript of collected.transcripts) {
      const key = `${transcript.phase}\u0000${transcript.unit ?? ''}\u0000${transcript.sectionId}`;
      recomputedBySection.set(key, (recomputedBySection.get(key) ?? false) || transcript.wastedModelCalls > 0 || transcript.generation > 0);
    }
    sectionsTotal += recomputedBySection.size;
    sectionsRecomputed += [...recomputedBySection.values()].filter(Boolean).length;
    const cost = collected.job.cost;
    modelCalls += cost.modelCalls ?? 0;
    toolCalls += cost.toolCalls ?? 0;
    spentUsd += cost.spentUsd ?? 0;
    for (const [name, value] of Object.entries(cost)) if (name.startsWith('wasted')) wasted.set(name, (wasted.get(name) ?? 0) + value);
    for (const event of collected.events) {
      if (event.kind === 'claimed') claims += 1;
      if (event.kind === 'reclaimed') reclaims += 1;
      if (event.kind === 'retrying') retries += 1;
      if (event.kind === 'redispatched') redispatches += 1;
    }
    for (const effect of collected.effects) effectsByState.set(effect.state, (effectsByState.get(effect.state) ?? 0) + 1);
  }
  const applies = observed.receiver.requests.filter((request) => request.op === 'apply');
  const receiverFaultyAnswers = new Map<string, number>();
  for (const request of observed.receiver.requests) {
    const normal = request.op === 'apply' ? request.outcome === 200 || request.outcome === 201 : request.outcome === 200 || request.outcome === 404;
    if (normal) continue;
    const label = `${request.op} ${String(request.outcome)}`;
    receiverFaultyAnswers.set(label, (receiverFaultyAnswers.get(label) ?? 0) + 1);
  }
  return {
    jobs: observed.jobs.length,
    notWhole,
    byState,
    sectionsTotal,
    sectionsRecomputed,
    modelCalls,
    toolCalls,
    spentUsd,
    wasted,
    claims,
    reclaims,
    retries,
    redispatches,
    receiverApplications: observed.receiver.applications.length,
    receiverApplyRequests: applies.length,
    receiverReplays: applies.filter((request) => request.outcome === 200).length,
    receiverLookups: observed.receiver.requests.filter((request) => request.op === 'lookup').length,
    receiverFaultyAnswers,
    effectsByState,
    toolExecutions: observed.toolExecutions.length,
    toolExecutionsDelivered: observed.toolExecutions.filter((execution) => execution.delivered).length,
    toolCallsRunMoreThanOnce: [...executionsByCall(observed.toolExecutions).values()].filter((runs) => runs.length > 1).length,
    toolResultsRecorded: [...recordedResults(observed).values()].reduce((sum, perJob) => sum + perJob.size, 0),
    toolRunsByFencedOutClaims: runsAfterRecords(observed).calls.reduce((sum, call) => sum + call.wasted.length, 0),
    toolExecutionsWithoutClaim: observed.toolExecutions.filter((execution) => execution.claim === undefined).length,
  };
}

export function checkInvariants(observed: Observed): CheckReport {
  const byId = new Map(observed.jobs.map((job) => [job.id, job]));
  const submissions = checkSubmissions(observed.submissions, byId);
  const results = checkResults(observed.jobs);
  const effects = checkEffects(observed);
  return {
    invariants: [
      result('submissionsNotAccepted', submissions.notAccepted),
      result('jobsLost', submissions.lost),
      result('duplicateJobs', submissions.duplicates),
      result('duplicatePublished', results.duplicates),
      result('resultsDisagree', results.disagree),
      result('duplicateEffects', effects.duplicates),
      result('effectsMisreported', effects.misreported),
      result('staleWrites', checkStaleWrites(observed.jobs)),
      result('withoutReason', checkReasons(observed.jobs)),
      result('redoneAfterCheckpoint', checkRedone(observed.jobs)),
      result('stranded', checkStranded(observed.jobs)),
      result('unsettledAfterStop', checkUnsettledAfterStop(observed.jobs)),
      result('toolCallRepeated', checkToolCalls(observed)),
      result('offTheTable', checkTimelines(observed.jobs)),
      result('fanOutOutlivedClaim', checkFanOutClaims(observed.jobs)),
      result('costNotSummed', checkCosts(observed.jobs)),
      result('expiryOnLiveJob', checkExpiryOnLiveJobs(observed.jobs)),
      result('effectsNeverSent', checkNeverSent(observed)),
    ],
    stats: statistics(observed),
  };
}
