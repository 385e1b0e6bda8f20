/** The soak's seeded plan, its process finder and its arguments: everything about it that needs no stack. */
import { parseChaosArgs } from '../../scripts/chaos/args';
import { FIRST_ROUND_GAP_MS, FIRST_ROUND_LENGTH, faultStream, offlineSettings, planJobs, planRun, planWaves, WAVES_FROM_MS } from '../../scripts/chaos/plan';
import { descendants, isZombie, parsePs, stackProcesses, workerPid } from '../../scripts/chaos/processes';
import { Rng } from '../../scripts/chaos/random';
import { parseOfflineSettings } from '../../functions/src/providers/offline/settings';
import { researchInput } from '../../functions/src/pipelines/research/pipeline';
import { notifyInput } from '../../functions/src/pipelines/notify/plan';

function take<T>(iterator: Iterator<T>, count: number): T[] {
  const out: T[] = [];
  for (let index = 0; index < count; index += 1) {
    const next = iterator.next();
    if (next.done === true) break;
    out.push(next.value);
  }
  return out;
}

describe('chaos plan', () => {
  test('the same seed gives the same plan; another seed another one', () => {
    expect(planRun({ jobs: 30, seed: 'a' })).toEqual(planRun({ jobs: 30, seed: 'a' }));
    expect(planRun({ jobs: 30, seed: 'a' }).jobs).not.toEqual(planRun({ jobs: 30, seed: 'b' }).jobs);
    expect(take(faultStream('a', 2_000), 40)).toEqual(take(faultStream('a', 2_000), 40));
  });

  test('the job mix does not move when the fault settings do', () => {
    expect(planRun({ jobs: 12, seed: 's', meanFaultGapSeconds: 1 }).jobs).toEqual(planRun({ jobs: 12, seed: 's', meanFaultGapSeconds: 9 }).jobs);
  });

  test('every planned input passes its pipeline schema, with the small sizes the soak wants', () => {
    const jobs = planJobs('inputs', 200);
    expect(new Set(jobs.map((job) => job.pipeline))).toEqual(new Set(['research', 'notify', 'canary']));
    expect(new Set(jobs.map((job) => job.idempotencyKey)).size).toBe(200);
    for (const job of jobs) {
      if (job.pipeline === 'research') {
        const input = researchInput.parse(job.input);
        expect(input.experts).toBeLessThanOrEqual(2);
        expect(input.sections).toBeLessThanOrEqual(2);
        expect(input.wordsPerSection).toBeLessThanOrEqual(70);
      }
      if (job.pipeline === 'notify') expect(notifyInput.parse(job.input).recipients).toBeLessThanOrEqual(5);
    }
  });

  test('the first round takes every fault kind once, early, with Firestore last', () => {
    expect(FIRST_ROUND_LENGTH).toBe(9);
    const first = take(faultStream('round', 2_000), FIRST_ROUND_LENGTH);
    expect(first.map((fault) => fault.atMs)).toEqual(first.map((_, index) => 500 + index * FIRST_ROUND_GAP_MS));
    expect(new Set(first.map((fault) => fault.spec.kind)).size).toBe(FIRST_ROUND_LENGTH);
    expect(first.slice(-2).map((fault) => fault.spec.kind)).toEqual(['rolling-deploy', 'checkpoint-write-failure']);
    const later = take(faultStream('round', 2_000), 300).slice(FIRST_ROUND_LENGTH);
    for (let index = 1; index < later.length; index += 1) expect((later[index]?.atMs ?? 0) >= (later[index - 1]?.atMs ?? 0)).toBe(true);
    expect(new Set(later.map((fault) => fault.spec.kind)).size).toBe(FIRST_ROUND_LENGTH);
    // A frozen worker stays stopped past its 8-second lease and the sweeper's next pass.
    for (const fault of [...first, ...later]) {
      if (fault.spec.kind === 'worker-freeze') expect(fault.spec.durationMs).toBeGreaterThanOrEqual(12_000);
      if (fault.spec.kind === 'rolling-deploy') expect(fault.spec.frozenMs).toBeGreaterThanOrEqual(12_000);
    }
  });

  test('a weighted kind: the first round and the default mix stay as they were, the later draws follow the weights', () => {
    const plain = take(faultStream('weights', 2_000), 300);
    expect(take(faultStream('weights', 2_000, {}), 300)).toEqual(plain);
    const focused = take(faultStream('weights', 2_000, { 'commit-answer-lost': 1_000 }), 300);
    expect(focused.slice(0, FIRST_ROUND_LENGTH)).toEqual(plain.slice(0, FIRST_ROUND_LENGTH));
    const later = focused.slice(FIRST_ROUND_LENGTH);
    expect(later.filter((fault) => fault.spec.kind === 'commit-answer-lost').length).toBeGreaterThan(later.length * 0.9);
    expect(planRun({ jobs: 12, seed: 'w', faultWeights: { 'task-loss': 0 } }).faults.slice(FIRST_ROUND_LENGTH).some((fault) => fault.spec.kind === 'task-loss')).toBe(false);
    expect(() => planRun({ jobs: 12, seed: 'w', faultWeights: { 'no-such-kind': 1 } as never })).toThrow('no injected fault kind no-such-kind');
    expect(parseChaosArgs(['--weight', 'commit-answer-lost=20', '--weight=task-loss=0'])).toMatchObject({ faultWeights: { 'commit-answer-lost': 20, 'task-loss': 0 } });
    expect(() => parseChaosArgs(['--weight', 'commit-answer-lost'])).toThrow('--weight wants KIND=N');
    expect(parseChaosArgs([])).not.toHaveProperty('faultWeights');
  });

  test('waves stay inside the window after the stack is up, and the functions accept the settings', () => {
    const waves = planWaves('w', 300_000);
    expect(waves.length).toBeGreaterThan(2);
    for (const wave of waves) {
      expect(wave.startMs).toBeGreaterThanOrEqual(WAVES_FROM_MS);
      expect(wave.endMs).toBeLessThanOrEqual(WAVES_FROM_MS + 300_000);
      expect(wave.endMs).toBeGreaterThan(wave.startMs);
    }
    const plan = planRun({ jobs: 100, seed: 'w' });
    expect(() => parseOfflineSettings(offlineSettings(plan, 1_700_000_000_000))).not.toThrow();
  });

  test('the seeded random source is uniform enough and forks independent streams', () => {
    const rng = new Rng('u');
    const draws = Array.from({ length: 10_000 }, () => rng.next());
    expect(Math.min(...draws)).toBeGreaterThanOrEqual(0);
    expect(Math.max(...draws)).toBeLessThan(1);
    expect(draws.reduce((sum, value) => sum + value, 0) / draws.length).toBeCloseTo(0.5, 1);
    expect(new Rng('u').fork('x').next()).not.toBe(new Rng('u').fork('y').next());
  });
});

describe('chaos processes', () => {
  const ps = [
    '    1     0     1 Ss   /sbin/init',
    '  500     1   500 Sl   node scripts/chaos.ts --jobs 4',
    '  510   500   510 Sl   java -Duser.language=en -cp /x/cloud-firestore-emulator.jar com.google.cloud.datastore.emulator.firestore.CloudFirestore start --host=127.0.0.1 --port=40001',
    '  520   500   520 Sl   node /work/main/node_modules/.bin/firebase emulators:start --only functions,tasks,auth --project demo-phaseline',
    '  530   520   520 Sl   /usr/bin/node /work/main/node_modules/firebase-tools/lib/emulator/functionsEmulatorRuntime',
    '  531   520   520 Z    [node] <defunct>',
    '  600     1   600 Sl   node /other/node_modules/.bin/firebase emulators:start --only functions',
    '  610   600   600 Sl   /usr/bin/node /other/node_modules/firebase-tools/lib/emulator/functionsEmulatorRuntime',
  ].join('\n');

  test('finds this run\'s firebase-tools, its workers and its Firestore by parentage, not by name', () => {
    const rows = parsePs(ps);
    expect(rows).toHaveLength(8);
    const found = stackProcesses(rows, 500);
    expect(found.firebase?.pid).toBe(520);
    expect(found.firestore?.pid).toBe(510);
    expect(found.workers.map((row) => row.pid)).toEqual([530]);
    expect(descendants(rows, 500).map((row) => row.pid).sort()).toEqual([510, 520, 530, 531]);
    expect(rows.filter(isZombie).map((row) => row.pid)).toEqual([531]);
  });

  test('reads the worker PID from a lease', () => {
    expect(workerPid('runsc-4242-0a1b2c3d')).toBe(4242);
    expect(workerPid('my-host-name-17-deadbeef')).toBe(17);
    expect(workerPid('someone')).toBeNull();
  });
});

describe('chaos arguments', () => {
  test('reads the options and refuses nonsense', () => {
    expect(parseChaosArgs(['--jobs', '4', '--seed', '1'])).toEqual({ jobs: 4, seed: '1', verbose: true });
    expect(parseChaosArgs(['--jobs=200', '--seed=abc', '--concurrency', '6', '--quiet'])).toEqual({ jobs: 200, seed: 'abc', verbose: false, concurrency: 6 });
    expect(parseChaosArgs(['--jobs', '200', '--seed', 'abc', '--concurrency', '4', '--fault-gap', '4'])).toEqual({ jobs: 200, seed: 'abc', verbose: true, concurrency: 4, faultGapSeconds: 4 });
    expect(parseChaosArgs(['--help'])).toEqual({ help: true });
    expect(() => parseChaosArgs(['--fault-gap', '0'])).toThrow(/--fault-gap must be a positive number/);
    expect(() => parseChaosArgs(['--jobs', '0'])).toThrow(/positive integer/);
    expect(() => parseChaosArgs(['--jobs', '2.5'])).toThrow(/positive integer/);
    expect(() => parseChaosArgs(['--seed', 'a b'])).toThrow(/--seed/);
    expect(() => parseChaosArgs(['--frobnicate'])).toThrow(/unknown argument/);
    expect(() => parseChaosArgs(['--jobs'])).toThrow(/needs a value/);
  });
});
