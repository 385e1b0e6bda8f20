/**
 * The admission decision of core/quota.ts without Firestore, and the PHASELINE_QUOTA_* settings
 * it is given.
 */
import { quotaDefaultsFromEnv } from '../../functions/src/config/environment';
import { decideAdmission, DEFAULT_QUOTA_DEFAULTS, limitsFor, nextSpendResetMs, spendDay, spendLimitMessage, type QuotaUsage } from '../../functions/src/core/quota';

const NOW = 1_000_000;
const usage = (inFlightJobIds: string[], recentSubmitsAtMs: number[] = []): QuotaUsage => ({ inFlightJobIds, recentSubmitsAtMs, updatedAtMs: 0 });
const limits = { jobsInFlight: 2, submitsPerMinute: 3, spendUsdPerDay: 5 };

describe('decideAdmission', () => {
  test('admits below both limits and records the job and the time', () => {
    expect(decideAdmission(usage(['a'], [NOW - 1_000]), new Set(), limits, 'new', NOW)).toEqual({
      admitted: true,
      usage: { inFlightJobIds: ['a', 'new'], recentSubmitsAtMs: [NOW - 1_000, NOW], updatedAtMs: NOW },
    });
  });

  test('drops ended jobs and submits older than the window from what it records', () => {
    const decided = decideAdmission(usage(['a', 'b'], [NOW - 60_000, NOW - 59_999]), new Set(['a']), limits, 'new', NOW);
    expect(decided).toEqual({ admitted: true, usage: { inFlightJobIds: ['b', 'new'], recentSubmitsAtMs: [NOW - 59_999, NOW], updatedAtMs: NOW } });
  });

  test('refuses at the in-flight limit first, with a fixed Retry-After', () => {
    const decided = decideAdmission(usage(['a', 'b'], [NOW, NOW, NOW]), new Set(), limits, 'new', NOW);
    expect(decided).toEqual({
      admitted: false,
      refusal: { limit: 'jobs_in_flight', allowed: 2, retryAfterSeconds: 30, message: 'You have 2 jobs in progress, the most allowed at once; try again when one finishes.' },
    });
  });

  test('refuses at the rate limit with the seconds until the oldest submit leaves the window, rounded up', () => {
    const decided = decideAdmission(usage([], [NOW - 500, NOW - 59_500, NOW - 100]), new Set(), limits, 'new', NOW);
    expect(decided).toEqual({
      admitted: false,
      refusal: { limit: 'submits_per_minute', allowed: 3, retryAfterSeconds: 1, message: 'You have submitted 3 jobs in the last minute, the most allowed; try again in 1 second.' },
    });
  });

  test('a limit of 0 refuses with a sentence that says so', () => {
    const decided = decideAdmission(usage([]), new Set(), { ...limits, jobsInFlight: 0 }, 'new', NOW);
    expect(decided.admitted).toBe(false);
    if (!decided.admitted) expect(decided.refusal.message).toMatch(/may not run jobs at the moment \(its limit of jobs in progress is 0\)/);
  });
});

describe('the daily spend limit at submit', () => {
  // 2026-12-01 18:30:00 UTC: five and a half hours before the day's spend resets.
  const EVENING = Date.UTC(2026, 11, 1, 18, 30);

  test('refuses a user whose spend today reached the cap, until UTC midnight, with a sentence that says when', () => {
    const decided = decideAdmission(usage([]), new Set(), limits, 'new', EVENING, 5);
    expect(decided).toEqual({
      admitted: false,
      refusal: {
        limit: 'spend_per_day',
        allowed: 5,
        retryAfterSeconds: 5.5 * 3600,
        message: "Today's model spend of $5.00 reached this account's daily limit of $5.00; it resets at 2026-12-02 00:00 UTC.",
      },
    });
  });

  test('admits just under the cap: a call is refused only once the cap is reached', () => {
    expect(decideAdmission(usage([]), new Set(), limits, 'new', EVENING, 4.99).admitted).toBe(true);
  });

  test('the other limits are named first: a user over every limit learns of the one that frees first', () => {
    const decided = decideAdmission(usage(['a', 'b']), new Set(), limits, 'new', EVENING, 50);
    expect(decided.admitted ? null : decided.refusal.limit).toBe('jobs_in_flight');
  });

  test('a cap of 0 says the account may not spend at all', () => {
    expect(spendLimitMessage(0, 0, EVENING)).toMatch(/may not spend on model calls at the moment \(its daily spend limit is \$0\)/);
  });

  test('days are UTC days, and the reset is the next UTC midnight', () => {
    expect(spendDay(EVENING)).toBe('2026-12-01');
    expect(spendDay(Date.UTC(2026, 11, 1, 23, 59, 59, 999))).toBe('2026-12-01');
    expect(spendDay(Date.UTC(2026, 11, 2))).toBe('2026-12-02');
    expect(nextSpendResetMs(EVENING)).toBe(Date.UTC(2026, 11, 2));
    expect(nextSpendResetMs(Date.UTC(2026, 11, 2))).toBe(Date.UTC(2026, 11, 3));
  });
});

describe('limitsFor', () => {
  test('takes the defaults of the kind of account, each replaced by the override that names it', () => {
    expect(limitsFor(DEFAULT_QUOTA_DEFAULTS, false, null)).toEqual({ jobsInFlight: 3, submitsPerMinute: 10, spendUsdPerDay: 10 });
    expect(limitsFor(DEFAULT_QUOTA_DEFAULTS, true, null)).toEqual({ jobsInFlight: 1, submitsPerMinute: 3, spendUsdPerDay: 1 });
    expect(limitsFor(DEFAULT_QUOTA_DEFAULTS, true, { jobsInFlight: 7 })).toEqual({ jobsInFlight: 7, submitsPerMinute: 3, spendUsdPerDay: 1 });
    expect(limitsFor(DEFAULT_QUOTA_DEFAULTS, true, { spendUsdPerDay: 25 })).toEqual({ jobsInFlight: 1, submitsPerMinute: 3, spendUsdPerDay: 25 });
  });
});

describe('quotaDefaultsFromEnv', () => {
  test('unset: the documented defaults', () => {
    expect(quotaDefaultsFromEnv({})).toEqual(DEFAULT_QUOTA_DEFAULTS);
  });

  test('each variable sets its own limit', () => {
    expect(
      quotaDefaultsFromEnv({
        PHASELINE_QUOTA_JOBS_IN_FLIGHT: '8',
        PHASELINE_QUOTA_SUBMITS_PER_MINUTE: '20',
        PHASELINE_QUOTA_ANONYMOUS_JOBS_IN_FLIGHT: '0',
        PHASELINE_QUOTA_ANONYMOUS_SUBMITS_PER_MINUTE: ' 2 ',
        PHASELINE_QUOTA_SPEND_USD_PER_DAY: '2.5',
        PHASELINE_QUOTA_ANONYMOUS_SPEND_USD_PER_DAY: '0',
        PHASELINE_QUOTA_ANONYMOUS_JOBS_IN_FLIGHT_TOTAL: '7',
      }),
    ).toEqual({ signedIn: { jobsInFlight: 8, submitsPerMinute: 20, spendUsdPerDay: 2.5 }, anonymous: { jobsInFlight: 0, submitsPerMinute: 2, spendUsdPerDay: 0 }, anonymousJobsInFlightTotal: 7 });
  });

  test('a malformed value is named with what it must be', () => {
    expect(() => quotaDefaultsFromEnv({ PHASELINE_QUOTA_JOBS_IN_FLIGHT: '2.5' })).toThrow('PHASELINE_QUOTA_JOBS_IN_FLIGHT must be an integer, got "2.5"');
    expect(() => quotaDefaultsFromEnv({ PHASELINE_QUOTA_ANONYMOUS_SUBMITS_PER_MINUTE: '601' })).toThrow('PHASELINE_QUOTA_ANONYMOUS_SUBMITS_PER_MINUTE must be at most 600, got "601"');
    expect(() => quotaDefaultsFromEnv({ PHASELINE_QUOTA_SPEND_USD_PER_DAY: '-1' })).toThrow(/PHASELINE_QUOTA_SPEND_USD_PER_DAY/);
  });
});
