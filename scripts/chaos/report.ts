/** The soak's printed report: the table, the definitions behind it, and the failures in detail. */
import type { CheckReport } from './invariants';
import { FAULT_KINDS, type FaultKind } from './plan';
import { formatRecovery, type KindFigures } from './recovery';

export interface FaultTally {
  readonly injected: number;
  readonly skipped: number;
}

export interface ReportInput {
  readonly seed: string;
  readonly jobs: number;
  readonly mix: Readonly<Record<string, number>>;
  readonly check: CheckReport;
  readonly faults: ReadonlyMap<FaultKind, FaultTally>;
  /** Recovery per fault kind (recovery.ts), when measured. */
  readonly recovery?: readonly KindFigures[];
  readonly decisionsAnswered: number;
  readonly timings: readonly (readonly [string, string])[];
  /** Problems of the run itself (processes left, time limit hit): they fail the run too. */
  readonly runProblems: readonly string[];
  readonly replay: string;
  /** More lines for the Work section: label, value. */
  readonly extra?: readonly (readonly [string, string])[];
}

const pad = (text: string, width: number): string => (text.length >= width ? text : text + ' '.repeat(width - text.length));
const padLeft = (text: string, width: number): string => (text.length >= width ? text : ' '.repeat(width - text.length) + text);
const usd = (value: number): string => `$${value.toFixed(4)}`;
const percent = (part: number, whole: number): string => (whole === 0 ? '—' : `${((100 * part) / whole).toFixed(1)} %`);

export function failed(input: Pick<ReportInput, 'check' | 'runProblems'>): boolean {
  return input.runProblems.length > 0 || input.check.invariants.some((invariant) => invariant.violations.length > 0);
}

export function formatReport(input: ReportInput): string {
  const { check } = input;
  const { stats } = check;
  const lines: string[] = [];
  const rule = '─'.repeat(78);
  const mix = Object.entries(input.mix)
    .map(([pipeline, count]) => `${pipeline} ${count}`)
    .join(', ');
  lines.push(rule, `Phaseline chaos soak · seed ${input.seed} · ${input.jobs} jobs (${mix})`, rule);
  for (const [what, when] of input.timings) lines.push(`${pad(what, 40)}${when}`);

  lines.push('', `${pad('Jobs by final state', 56)}${padLeft('jobs', 8)}`);
  for (const [state, count] of [...stats.byState].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1))) lines.push(`  ${pad(state, 54)}${padLeft(String(count), 8)}`);
  lines.push(`  ${pad('total job documents', 54)}${padLeft(String(stats.jobs), 8)}`);
  if (stats.notWhole.length > 0) {
    lines.push('', 'Jobs not completed whole, with the reason their document gives (up to 20)');
    for (const item of stats.notWhole.slice(0, 20)) {
      lines.push(...wrap(`${item.jobId} (${item.pipeline}) ${item.state}: ${item.reason.replace(/\s+/g, ' ').slice(0, 300)}`, 110, '  ', '      '));
    }
  }

  lines.push('', `${pad('Faults injected by kind', 56)}${padLeft('injected', 10)}${padLeft('no target', 11)}`);
  let injected = 0;
  for (const kind of FAULT_KINDS) {
    const tally = input.faults.get(kind) ?? { injected: 0, skipped: 0 };
    injected += tally.injected;
    lines.push(`  ${pad(kind, 54)}${padLeft(String(tally.injected), 10)}${padLeft(String(tally.skipped), 11)}`);
  }
  lines.push(`  ${pad('total', 54)}${padLeft(String(injected), 10)}`);
  if (input.recovery) lines.push('', ...formatRecovery(input.recovery));

  lines.push('', `${pad('Invariants (each must be 0)', 56)}${padLeft('count', 8)}`);
  for (const invariant of check.invariants) {
    lines.push(`  ${pad(invariant.label, 54)}${padLeft(String(invariant.violations.length), 8)}  ${invariant.violations.length === 0 ? 'ok' : 'BROKEN'}`);
  }
  for (const problem of input.runProblems) lines.push(`  run problem: ${problem}  BROKEN`);

  const wasted = [...stats.wasted].sort((a, b) => (a[0] < b[0] ? -1 : 1));
  const row = (label: string, value: string): string => `  ${pad(label, 60)}${value}`;
  const wastedCalls = stats.wasted.get('wastedModelCalls') ?? 0;
  lines.push(
    '',
    'Work',
    row('sections recomputed / sections total', `${stats.sectionsRecomputed} / ${stats.sectionsTotal} (${percent(stats.sectionsRecomputed, stats.sectionsTotal)})`),
    row('model calls, of which wasted', `${stats.modelCalls}, ${wastedCalls} (${percent(wastedCalls, stats.modelCalls)})`),
    row('tool calls, of which wasted', `${stats.toolCalls}, ${stats.wasted.get('wastedToolCalls') ?? 0}`),
    row(
      'tool runs logged (delivered); IDs run twice+; recorded',
      `${stats.toolExecutions} (${stats.toolExecutionsDelivered}); ${stats.toolCallsRunMoreThanOnce}; ${stats.toolResultsRecorded}`,
    ),
    row('tool runs by fenced-out claims after the record; runs naming no claim', `${stats.toolRunsByFencedOutClaims}; ${stats.toolExecutionsWithoutClaim}`),
    row('wasted cost (sum of cost.wasted*)', wasted.length === 0 ? '0' : wasted.map(([name, value]) => `${name} ${name.endsWith('Usd') ? usd(value) : String(value)}`).join(', ')),
    row('simulated spend (cost.spentUsd), wasted share', `${usd(stats.spentUsd)}, ${percent(stats.wasted.get('wastedUsd') ?? 0, stats.spentUsd)}`),
    row('claims / reclaims / retries / lost-task redispatches', `${stats.claims} / ${stats.reclaims} / ${stats.retries} / ${stats.redispatches}`),
    row('receiver: applications / apply requests / replays / lookups', `${stats.receiverApplications} / ${stats.receiverApplyRequests} / ${stats.receiverReplays} / ${stats.receiverLookups}`),
    row(
      'receiver answers spoiled by its faults (request, outcome)',
      [...stats.receiverFaultyAnswers].map(([what, count]) => `${what}: ${count}`).join(', ') || 'none',
    ),
    row('effect ledger entries by state', [...stats.effectsByState].map(([state, count]) => `${state} ${count}`).join(', ') || 'none'),
    row('questions answered "retry the unknown ones" after the faults', String(input.decisionsAnswered)),
    ...(input.extra ?? []).map(([label, value]) => row(label, value)),
  );

  lines.push('', 'Definitions');
  for (const invariant of check.invariants) lines.push(...wrap(`${invariant.label}: ${invariant.definition}.`, 76, '  ', '    '));
  lines.push(
    ...wrap(
      'sections recomputed: an agent section (outline, perspectives, one expert section, one report section; one transcript each) ' +
        'whose cumulative tally records wasted model calls or that restarted on a clean thread (generation > 0): some of its model ' +
        'output was thrown away and produced again (a worker killed between calls, a malformed or truncated answer, a cold retry). ' +
        'Work of a worker that lost its claim never reaches the transcript or the cost counters, so this is a lower bound.',
      76,
      '  ',
      '    ',
    ),
    ...wrap(
      'recovery: per fault that hit something, seconds from the fault to the next commit of the hit job\'s work (a section, checkpoint, ' +
        'transcript save, effect entry, unit or job event; not a claim, reclaim or redispatch): for a hit claim (a worker killed, frozen, ' +
        'fenced, its task lost, an answer lost) the first by a later claim of the same job or unit, the unit\'s finish once the claim was ' +
        'reclaimed, or the job\'s end; the hit claim\'s own next work counts when nothing showed a later claim before it, except after a kill, ' +
        'a freeze or a lost task (a stopped worker\'s commit still in flight is no recovery); for a hit job, its first by any claim. A fault that hit several jobs counts its slowest. p50/p95/p99 are ' +
        'nearest-rank (under 100 faults the p99 is the worst); none: faults with a job that never progressed after them; ovl: recoveries ' +
        'during which another fault hit the same job (counted, but their figure holds that fault\'s delay too); wait: recoveries during ' +
        'which the job was parked in a wait (a provider\'s cool-down, a person\'s answer: counted, but their figure holds the wait); alone: ' +
        'the p99 over the recoveries no other fault overlapped, each less the time its job was parked in a wait. Taken over: the recoveries of a hit claim that another claim replaced, split where ' +
        'something first showed the replacement (a reclaim, or the later claim\'s work): tk, fault to take-over (the lease, the ' +
        'take-over age and the sweep); then, take-over to progress (the new task delivered, a worker started, the claim made and its ' +
        'first commit).',
      76,
      '  ',
      '    ',
    ),
    ...wrap('wasted cost: the jobs\' cost.wasted* counters summed (model and tool calls whose output was discarded, with their simulated price).', 76, '  ', '    '),
    ...wrap(
      'tool runs: lines of the offline toolbox\'s execution log, one per execution in any worker (delivered: its result reached the ' +
        'section); IDs run twice+: call IDs executed more than once, an interrupted result or a worker lost before its save when not ' +
        'counted above; recorded: (job, call ID) pairs whose result a transcript recorded.',
      76,
      '  ',
      '    ',
    ),
    ...wrap(
      'step outcomes: how each delivered task ended, as runJobStep logged it. ownership-lost is a worker fenced out mid-step (its later ' +
        'writes refused); not-claimable is a duplicate or stale delivery acknowledged without work.',
      76,
      '  ',
      '    ',
    ),
    ...wrap(
      'faults: worker-kill SIGKILLs the function worker holding a live lease; worker-freeze SIGSTOPs it past its lease, then SIGCONTs it; ' +
        'task-loss makes the tasks emulator\'s step queue again (its tasks orphaned) and SIGKILLs a lease holder, whose task never comes back; ' +
        'commit-answer-lost drops a lease holder\'s Firestore answers until one of its commits lands, then resets its connections; ' +
        'rolling-deploy reloads the functions while steps run (old workers finish beside new ones), one or two old ones frozen first; ' +
        'lease-expiry moves a live lease into the past and sweeps; ' +
        'checkpoint-write-failure stalls Firestore (SIGSTOP) or cuts every connection to it; receiver-outage makes the receiver answer ' +
        '503, refuse connections, hang after applying, fail before applying, drop connections, or fail lookups; duplicate-delivery ' +
        'enqueues an extra copy of a step task; provider-wave is a 429/503 window in the offline provider; submit-retry re-sends a ' +
        'submission with the same Idempotency-Key; owner-cancel cancels a notify job, as its owner over HTTP, while one of its effects is ' +
        'in flight (the receiver hangs the next apply once the job is seen in its send phase). "no target": nothing was running that the fault could hit (for owner-cancel: the job ended first).',
      76,
      '  ',
      '    ',
    ),
  );

  const broken = check.invariants.filter((invariant) => invariant.violations.length > 0);
  if (broken.length > 0) {
    lines.push('', 'Violations (up to 10 per invariant)');
    for (const invariant of broken) {
      lines.push(`  ${invariant.label}:`);
      for (const violation of invariant.violations.slice(0, 10)) lines.push(`    - ${violation.jobId ?? '(no job)'}: ${violation.detail}`);
    }
  }
  lines.push(rule);
  lines.push(failed(input) ? `FAILED: an invariant broke. Seed ${input.seed}; replay with: ${input.replay}` : `OK: every invariant held (seed ${input.seed}).`);
  return lines.join('\n');
}

function wrap(text: string, width: number, first: string, rest: string): string[] {
  const out: string[] = [];
  let current = '';
  for (const word of text.split(/\s+/).filter(Boolean)) {
    const prefix = out.length === 0 ? first : rest;
    if (current !== '' && prefix.length + current.length + 1 + word.length > width) {
      out.push(prefix + current);
      current = word;
    } else {
      current = current === '' ? word : `${current} ${word}`;
    }
  }
  if (current !== '') out.push((out.length === 0 ? first : rest) + current);
  return out;
}
