import type { SweepReport } from '../../functions/src/engine/sweeper';
import {
  byTime,
  clockTime,
  costSummary,
  dateTime,
  duration,
  finalLines,
  jobTable,
  progressBar,
  progressOf,
  reportLines,
  statusLine,
  sweepReportLines,
  terminalText,
  timelineLine,
} from '../../scripts/cli/format';
import { queueStatsLines } from '../../scripts/cli/queue-commands';
import type { EventView, JobView } from '../../scripts/cli/views';

const UTC = { timeZone: 'UTC' };
const T0 = Date.UTC(2026, 2, 14, 9, 26, 53);

function job(overrides: Partial<JobView> = {}): JobView {
  return {
    id: 'job-1',
    owner: 'user-1',
    pipeline: 'research',
    status: 'running',
    outcome: null,
    phase: 'final-document',
    progress: {},
    cost: {},
    waiting: null,
    lastError: null,
    quarantine: null,
    cancellation: null,
    fanout: null,
    conversationId: null,
    createdAtMs: T0,
    updatedAtMs: T0,
    finishedAtMs: null,
    ...overrides,
  };
}

/** Any character a terminal acts on: C0 but tab, DEL, C1, and the bidirectional controls. */
// Built from code points, since the characters themselves are what is tested.
const CONTROLS = new RegExp(`[${[[0x00, 0x08], [0x0a, 0x1f], [0x7f, 0x9f], [0x202a, 0x202e], [0x2066, 0x2069]].map(([from = 0, to = 0]) => `${String.fromCodePoint(from)}-${String.fromCodePoint(to)}`).join('')}]`, 'u');

const event = (id: string, atMs: number, overrides: Partial<EventView> = {}): EventView => ({ id, kind: 'claimed', message: 'Claimed by w (epoch 1)', unit: null, atMs, ...overrides });

describe('progress bar', () => {
  test.each([
    [0, '[░░░░░░░░░░]'],
    [0.5, '[█████░░░░░]'],
    [0.34, '[███░░░░░░░]'],
    [1, '[██████████]'],
    [1.7, '[██████████]'],
    [-1, '[░░░░░░░░░░]'],
    [Number.NaN, '[░░░░░░░░░░]'],
  ])('%d fills %s', (fraction, bar) => {
    expect(progressBar(fraction, 10)).toBe(bar);
  });

  test('is 24 cells wide by default', () => {
    expect(progressBar(0.25)).toBe(`[${'█'.repeat(6)}${'░'.repeat(18)}]`);
  });
});

describe('progress of a job', () => {
  test('a fan-out in progress counts its units', () => {
    expect(progressOf(job({ phase: 'expert-content', fanout: { phase: 'expert-content', epoch: 3, units: 4, done: 1 }, progress: { sectionsTotal: 3 } }))).toEqual({
      fraction: 0.25,
      detail: 'expert-content: 1/4 units',
    });
  });

  test('otherwise the sections of the phase: the final document\'s, or plain sections', () => {
    expect(progressOf(job({ progress: { sectionsTotal: 4, documentSectionsDone: 3 } }))).toEqual({ fraction: 0.75, detail: 'final-document: 3/4 sections' });
    expect(progressOf(job({ phase: 'measure', progress: { sectionsTotal: 5, sectionsDone: 2 } }))).toEqual({ fraction: 0.4, detail: 'measure: 2/5 sections' });
    expect(progressOf(job({ phase: 'outline', progress: { sectionsTotal: 3 } }))).toEqual({ fraction: 0, detail: 'outline: 0/3 sections' });
  });

  test('nothing to measure by: no fraction, just the phase', () => {
    expect(progressOf(job({ phase: 'outline' }))).toEqual({ fraction: null, detail: 'outline' });
    expect(progressOf(job({ status: 'queued', phase: null }))).toEqual({ fraction: null, detail: 'not started' });
  });

  test('a completed job is whole', () => {
    expect(progressOf(job({ status: 'completed', outcome: 'partial', phase: null }))).toEqual({ fraction: 1, detail: 'done' });
  });
});

describe('status line', () => {
  test('running, with the phase\'s progress and the cost', () => {
    expect(statusLine(job({ progress: { sectionsTotal: 4, documentSectionsDone: 2 }, cost: { spentUsd: 0.00213, modelCalls: 14, toolCalls: 1 } }), UTC)).toBe(
      `running     [${'█'.repeat(12)}${'░'.repeat(12)}]  50%  final-document: 2/4 sections · $0.0021 · 14 model calls · 1 tool call`,
    );
  });

  test('unmeasured progress shows no percentage', () => {
    expect(statusLine(job({ status: 'queued', phase: null }))).toBe(`queued      [${'░'.repeat(24)}]   --  not started`);
  });

  test('waiting for a decision names the question; a provider wait says when it resumes', () => {
    const decision = { reason: 'decision' as const, questionId: 'scope', question: 'How deep?', options: ['a', 'b'], untilMs: null };
    expect(statusLine(job({ status: 'waiting', waiting: decision }), UTC)).toMatch(/^waiting {5}\[.*\] +-- {2}needs your decision: How deep\?$/);
    const provider = { reason: 'provider' as const, questionId: 'provider', question: 'Provider down', options: [], untilMs: T0 + 90_000 };
    expect(statusLine(job({ status: 'waiting', waiting: provider }), UTC)).toMatch(/provider unavailable; resumes by itself at 09:28:23$/);
  });

  test('a retry names the error that caused it', () => {
    const lastError = { code: 'rate_limited', message: 'slow down', retryable: true, atMs: T0 };
    expect(statusLine(job({ status: 'queued', lastError }))).toMatch(/ retrying final-document after rate_limited$/);
  });

  test('the ends say why', () => {
    expect(statusLine(job({ status: 'failed', lastError: { code: 'terminal', message: 'bad input', retryable: false, atMs: T0 } }))).toMatch(/failed: bad input$/);
    expect(statusLine(job({ status: 'cancelled', cancellation: { reason: 'too slow', by: null, atMs: T0, phase: null, sectionsDone: null, effects: null } }))).toMatch(/cancelled: too slow$/);
    expect(statusLine(job({ status: 'quarantined', quarantine: { reason: 'lease expired 4 times', atMs: T0 } }))).toMatch(/quarantined: lease expired 4 times$/);
    expect(statusLine(job({ status: 'completed', outcome: 'partial', phase: null }))).toBe(`completed   [${'█'.repeat(24)}] 100%  completed, partial`);
  });
});

describe('timeline', () => {
  test('a line: clock time, kind, unit, message', () => {
    expect(timelineLine(event('j00000002', T0), UTC)).toBe('09:26:53  claimed       Claimed by w (epoch 1)');
    expect(timelineLine(event('u-e1-0001', T0 + 1_000, { kind: 'checkpointed', message: 'Section h2 recorded', unit: 'e1' }), UTC)).toBe(
      '09:26:54  checkpointed  [e1] Section h2 recorded',
    );
  });

  test('a kind longer than the column still leaves a space', () => {
    expect(timelineLine(event('j1', T0, { kind: 'section-skipped', message: 'm' }), UTC)).toBe('09:26:53  section-skipped m');
  });

  test('events sort by time, then by ID', () => {
    const sorted = [event('j00000003', T0 + 5), event('u-e1-x', T0), event('j00000002', T0)].sort(byTime).map((item) => item.id);
    expect(sorted).toEqual(['j00000002', 'u-e1-x', 'j00000003']);
  });

  test('times in a given zone', () => {
    expect(clockTime(T0, { timeZone: 'Asia/Tokyo' })).toBe('18:26:53');
    expect(dateTime(T0, UTC)).toBe('2026-03-14 09:26');
  });
});

describe('numbers', () => {
  test.each([
    [0, '0 ms'],
    [850, '850 ms'],
    [42_400, '42 s'],
    [185_000, '3m 05s'],
    [7_620_000, '2h 07m'],
  ])('duration(%d) = %s', (ms, text) => {
    expect(duration(ms)).toBe(text);
  });

  test('cost: dollars, model and tool calls, or nothing', () => {
    expect(costSummary({ spentUsd: 1.234, modelCalls: 1, toolCalls: 2, inputTokens: 9 })).toBe('$1.23 · 1 model call · 2 tool calls');
    expect(costSummary({ spentUsd: 0 })).toBe('$0.0000');
    expect(costSummary({})).toBeNull();
  });
});

describe('the end of a watch', () => {
  test('completed: how long, where the report is, the cost', () => {
    const done = job({ status: 'completed', outcome: 'complete', finishedAtMs: T0 + 125_000, cost: { spentUsd: 0.5 } });
    expect(finalLines(done, 'jobs/job-1/results/final')).toEqual(['Completed in 2m 05s.', 'Report: jobs/job-1/results/final', 'Cost: $0.5000']);
    expect(finalLines({ ...done, outcome: 'partial' }, 'p')[0]).toBe('Completed (partial: some parts are missing, named in the report) in 2m 05s.');
  });

  test('waiting for a decision: the question, the options and the command to answer', () => {
    const waiting = job({ status: 'waiting', waiting: { reason: 'decision', questionId: 'scope', question: 'How deep?', options: ['shallow', 'deep'], untilMs: null } });
    expect(finalLines(waiting, 'p')).toEqual(['Waiting for your decision: How deep?', 'Options: "shallow", "deep"', 'Answer with: phaseline decide job-1 scope <option>']);
  });

  test('failed, cancelled, quarantined: the reason and what can be done', () => {
    expect(finalLines(job({ status: 'failed', finishedAtMs: T0 + 2_000, lastError: { code: 'terminal', message: 'bad input', retryable: false, atMs: T0 } }), 'p')).toEqual([
      'Failed in 2 s: bad input (terminal)',
    ]);
    expect(finalLines(job({ status: 'cancelled', finishedAtMs: T0, cancellation: { reason: 'r', by: null, atMs: T0, phase: 'outline', sectionsDone: 2, effects: null } }), 'p')).toEqual([
      'Cancelled in 0 ms.',
      'Cancelled by its owner during outline (r). 2 sections were finished.',
    ]);
    const effects = { counts: { planned: 3, applying: 0, applied: 5, unknown: 1, failed: 1 }, settled: false, checkedWith: null, checkedAtMs: null };
    expect(finalLines(job({ status: 'cancelled', finishedAtMs: T0, cancellation: { reason: 'r', by: null, atMs: T0, phase: 'send', sectionsDone: null, effects } }), 'p')).toEqual([
      'Cancelled in 0 ms.',
      'Cancelled by its owner during send (r). Effects: 5 applied, 4 not applied, 1 unknown (being checked). ' +
        'Effects already applied (messages sent, payments made) cannot be undone by cancelling.',
    ]);
    expect(finalLines(job({ status: 'quarantined', quarantine: { reason: 'lease expired 4 times', atMs: T0 } }), 'p')).toEqual([
      'Quarantined: lease expired 4 times.',
      'It keeps killing its workers; once the cause is fixed an operator can run: phaseline release job-1',
    ]);
  });
});

describe('tables', () => {
  test('jobs: aligned columns, the owner only when asked for', () => {
    const rows = [job({ id: 'kAbc', status: 'completed', outcome: 'complete', phase: null }), job({ id: 'j2', pipeline: 'canary', progress: { sectionsTotal: 3, sectionsDone: 1 }, phase: 'measure' })];
    expect(jobTable(rows, UTC)).toEqual([
      'JOB   STATUS     PIPELINE  PROGRESS  CREATED           DETAIL',
      'kAbc  completed  research  100%      2026-03-14 09:26  completed',
      'j2    running    canary    33%       2026-03-14 09:26  measure: 1/3 sections',
    ]);
    expect(jobTable(rows, { ...UTC, withOwner: true })[0]).toBe('JOB   STATUS     PIPELINE  PROGRESS  CREATED           OWNER   DETAIL');
    expect(jobTable([], UTC)).toEqual(['No jobs.']);
  });

  test('a long detail is cut', () => {
    const [, row] = jobTable([job({ status: 'failed', lastError: { code: 'x', message: 'y'.repeat(200), retryable: false, atMs: T0 } })], UTC);
    expect(row?.endsWith('…')).toBe(true);
    expect(row?.length).toBeLessThan(140);
  });

  test('a sweep report', () => {
    const report: SweepReport = {
      nowMs: T0,
      reclaimed: 2,
      unitsReclaimed: 1,
      quarantined: 1,
      redispatched: 0,
      unitsRedispatched: 0,
      resumed: 1,
      parkedUnits: 0,
      skipped: 1,
      enqueued: 3,
      enqueueFailures: 1,
      errors: 1,
      queryPages: 5,
      queryDocuments: 6,
      documentsRead: 12,
      truncated: ['expiredJobLeases'],
      stoppedEffects: {
        checked: 2,
        settled: 1,
        deferred: 3,
        pending: 1,
        effectsFoundApplied: 1,
        effectsNotApplied: 0,
        skipped: 0,
        errors: 1,
        carriedOver: 0,
        queryPages: 3,
        queryDocuments: 5,
        truncated: [],
      },
      retention: { jobsStamped: 2, jobsContinued: 1, jobsDeferred: 0, skipped: 0, documentsRead: 40, documentsStamped: 37, errors: 1, queryPages: 3, budgetSpent: true },
    };
    expect(sweepReportLines(report)).toEqual([
      'Sweep at 2026-03-14T09:26:53.000Z:',
      '  reclaimed      2 expired job leases, 1 expired unit lease',
      '  quarantined    1 job',
      '  re-dispatched  0 jobs and 0 units whose task went missing',
      '  resumed        1 job whose provider wait was over',
      '  parked         0 leftover units',
      '  left alone     1 document that changed since the query',
      '  tasks          3 enqueued, 1 failed (a failed one is dispatched again by a later sweep)',
      '  read           12 documents in 5 query pages',
      '  effects        2 stopped jobs checked with the system of record: 1 settled, 1 still unknown, 3 in their grace period',
      '  retention      37 documents of ended jobs given expireAt: 2 jobs done, 1 to go on next sweep',
      '  errors         3 (see the warnings above; the next sweep tries again)',
      '  unfinished     expiredJobLeases hit the page limit; the next sweep continues',
    ]);
  });

  test('queue statistics', () => {
    const stats = {
      name: 'projects/p/locations/us-central1/queues/runJobStep',
      state: 'RUNNING',
      tasks: 12,
      oldestTaskMs: T0 - 243_000,
      dispatchedLastMinute: 30,
      running: 4,
      effectiveRatePerSecond: 12.345,
      maxRatePerSecond: 50,
      maxConcurrent: 100,
    };
    expect(queueStatsLines(stats, T0, UTC)).toEqual([
      'Queue projects/p/locations/us-central1/queues/runJobStep: RUNNING',
      '  tasks waiting  12',
      '  oldest task    2026-03-14 09:22 (4m 03s ago)',
      '  dispatched     30 in the last minute',
      '  running now    4',
      '  dispatch rate  12.35/s (at most 50/s, 100 at once)',
    ]);
    expect(queueStatsLines({ ...stats, tasks: 0, effectiveRatePerSecond: null, maxConcurrent: null }, T0, UTC).slice(1)).toEqual([
      '  tasks waiting  0',
      '  oldest task    none',
      '  dispatched     30 in the last minute',
      '  running now    4',
      '  dispatch rate  unknown (at most 50/s, unknown at once)',
    ]);
  });
});

describe('model-written text cannot drive the terminal', () => {
  const hostile = [
    '# Report \u001b]0;window title\u0007',
    'Text \u001b[2J\u001b[31mred\u001b[0m and an OSC 8 link \u001b]8;;file:///etc/passwd\u001b\\click\u001b]8;;\u001b\\',
    'One-byte CSI \u009b31m, DEL \u007f, backspace x\u0008, bell \u0007 and a carriage return\rover the line',
    'Reversed \u202egnp.exe\u202c and isolated \u2066text\u2069',
  ].join('\n');

  test('a report prints with every control character escaped, line by line, and nothing else changed', () => {
    const lines = reportLines(hostile);
    for (const line of lines) expect(line).not.toMatch(CONTROLS);
    expect(lines).toEqual([
      '# Report \\x1b]0;window title\\x07',
      'Text \\x1b[2J\\x1b[31mred\\x1b[0m and an OSC 8 link \\x1b]8;;file:///etc/passwd\\x1b\\click\\x1b]8;;\\x1b\\',
      'One-byte CSI \\x9b31m, DEL \\x7f, backspace x\\x08, bell \\x07 and a carriage return\\x0dover the line',
      'Reversed \\u202egnp.exe\\u202c and isolated \\u2066text\\u2069',
    ]);
    expect(reportLines('first\r\nsecond\ttabbed · café ✓')).toEqual(['first', 'second\ttabbed · café ✓']);
  });

  test('links: http(s) targets are shown, any other target is dropped, reference definitions included', () => {
    const report = [
      'Leases expire [1]. See [the docs](https://example.com/docs_(v2) "Docs") and <https://example.org/a>.',
      'Bad: [x](javascript:alert(1)), [y](JAVASCRIPT:alert(1)), [z](<data:text/html,hi>), [w](//evil.example), ![img](file:///etc/passwd), <javascript:alert(1)>.',
      '',
      '[1]: https://example.com/leases "Leases"',
      '[2]: javascript:alert(1)',
      '   [3]: <vbscript:msgbox(1)> "Three"',
    ].join('\n');
    expect(reportLines(report)).toEqual([
      'Leases expire [1]. See the docs <https://example.com/docs_(v2)> and <https://example.org/a>.',
      'Bad: x, y, z, w, img, javascript:alert(1).',
      '',
      '[1]: https://example.com/leases "Leases"',
      '[2]: (link removed: not an http(s) URL)',
      '   [3]: (link removed: not an http(s) URL)',
    ]);
  });

  test('event messages, questions and errors are escaped where they are shown', () => {
    const escape = 'Done\u001b]0;owned\u0007\nFAKE: job completed';
    expect(terminalText(escape)).toBe('Done\\x1b]0;owned\\x07\\nFAKE: job completed');
    expect(timelineLine(event('j1', T0, { kind: 'note\u001b[8m', message: escape, unit: 'e\u001b1' }), UTC)).toBe(
      '09:26:53  note\\x1b[8m   [e\\x1b1] Done\\x1b]0;owned\\x07\\nFAKE: job completed',
    );
    const waiting = { reason: 'decision' as const, questionId: 'q', question: `Pick\u001b[2J`, options: ['a\u009b', 'b'], untilMs: null };
    for (const line of [...finalLines(job({ status: 'waiting', waiting }), 'r'), statusLine(job({ status: 'waiting', waiting }))]) expect(line).not.toMatch(CONTROLS);
    const lastError = { code: 'terminal', message: escape, retryable: false, atMs: T0 };
    for (const line of [...finalLines(job({ status: 'failed', lastError }), 'r'), statusLine(job({ status: 'failed', lastError }))]) expect(line).not.toMatch(CONTROLS);
    for (const line of jobTable([job({ status: 'quarantined', quarantine: { reason: escape, atMs: T0 } })], UTC)) expect(line).not.toMatch(CONTROLS);
  });
});

describe('bug 34: a job waiting at its spend cap, and what users control', () => {
  const budget = { reason: 'budget' as const, questionId: 'budget', question: "Today's model spend of $1.00 reached this account's daily limit of $1.00; it resets at 00:00 UTC.", options: ['resume', 'cancel'], untilMs: Date.UTC(2026, 2, 15) };

  test('bug 34: the status line, the list and the end of a watch say it is paused at the spend limit, when it resumes, and how to resume or cancel it', () => {
    const paused = job({ status: 'waiting', waiting: budget });
    expect(statusLine(paused, UTC)).toMatch(/^waiting {5}\[.*\] +-- {2}paused at the daily spend limit until 2026-03-15 00:00$/);
    expect(jobTable([paused], UTC)[1]).toMatch(/ waiting +research +-- +2026-03-14 09:26 +paused at the daily spend limit until 2026-03-15 00:00$/);
    expect(finalLines(paused, 'p', UTC)).toEqual([
      `Paused at the daily spend limit: ${budget.question}`,
      'It resumes by itself at 2026-03-15 00:00. Once an operator has raised the limit, resume it sooner with: phaseline decide job-1 budget resume',
      'Or stop it: phaseline cancel job-1',
    ]);
  });

  test('bug 34: a list escapes owner IDs, job IDs, pipeline and phase names, and error codes', () => {
    const hostile = 'u\u001b]0;pwned\u0007\u009b2J\u202e';
    const rows = [
      job({ owner: hostile, id: `j${hostile}`, pipeline: `p${hostile}`, phase: `ph${hostile}`, progress: { sectionsTotal: 2, sectionsDone: 1 } }),
      job({ status: 'queued', phase: `ph${hostile}`, lastError: { code: `c${hostile}`, message: 'm', retryable: true, atMs: T0 } }),
      job({ fanout: { phase: `f${hostile}`, epoch: 1, units: 2, done: 1 } }),
    ];
    const lines = jobTable(rows, { ...UTC, withOwner: true });
    for (const line of lines) expect(line).not.toMatch(CONTROLS);
    expect(lines[1]).toContain('u\\x1b]0;pwned\\x07\\x9b2J\\u202e');
    for (const row of rows) for (const line of [statusLine(row, UTC), ...finalLines(row, 'p', UTC)]) expect(line).not.toMatch(CONTROLS);
  });
});

