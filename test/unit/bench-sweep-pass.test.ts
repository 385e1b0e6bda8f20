/** The bench's model of when the sweeper passes (bench/lib/cloud-tasks.ts nextSweepPass), against sweepJobs' schedule. */
import { nextSweepPass, SWEEP_PERIOD_MS } from '../../bench/lib/cloud-tasks';

test('the schedule is every minute', () => {
  expect(SWEEP_PERIOD_MS).toBe(60_000);
});

test('recovery passes every interval after a full sweep, the next full sweep at the next minute, always strictly after the time given', () => {
  expect(nextSweepPass(0, 5_000)).toEqual({ atMs: 5_000, full: false });
  expect(nextSweepPass(4_999, 5_000)).toEqual({ atMs: 5_000, full: false });
  expect(nextSweepPass(5_000, 5_000)).toEqual({ atMs: 10_000, full: false });
  expect(nextSweepPass(54_999, 5_000)).toEqual({ atMs: 55_000, full: false });
  expect(nextSweepPass(55_000, 5_000)).toEqual({ atMs: 60_000, full: true });
  expect(nextSweepPass(120_000 + 21_000, 5_000)).toEqual({ atMs: 120_000 + 25_000, full: false });
});

test('an interval that does not divide the minute stops one interval before the next run', () => {
  // Passes at 0, 7, ..., 49 (56 would leave less than an interval before the run at 60).
  expect(nextSweepPass(49_000, 7_000)).toEqual({ atMs: 60_000, full: true });
  expect(nextSweepPass(48_999, 7_000)).toEqual({ atMs: 49_000, full: false });
  expect(nextSweepPass(10_000, 60_000)).toEqual({ atMs: 60_000, full: true });
});

test('a non-positive interval is refused', () => {
  expect(() => nextSweepPass(0, 0)).toThrow(/sweep interval must be positive/);
});
