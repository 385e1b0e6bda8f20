/**
 * `npm run chaos -- --jobs N --seed S`: the chaos soak.
 *
 * Starts the real local stack (the official Firestore emulator, firebase-tools' functions, tasks
 * and auth emulators, the sweeper every 2 s) with 8-second leases and a receiver for the notify
 * jobs; submits a seeded mix of small research, notify and canary jobs over HTTP as signed-in
 * users, with bounded concurrency; injects seeded faults while they run (function workers killed
 * mid-step, leases expired under live owners, provider error waves, receiver outages, Firestore
 * stopped mid-write, duplicate task deliveries, retried submissions); once the faults stop,
 * answers "retry the unknown ones" to jobs that wait on effects nobody could check, and settles
 * stopped jobs' effects in one sweeper pass dated past their grace period; then checks every
 * invariant against Firestore, the receiver and the offline toolbox's execution log (every tool
 * run of every worker), prints the table, and exits 1 when one broke (printing the seed to
 * replay), 2 when the run itself could not be made.
 *
 * Options:
 *   --jobs N            jobs to submit (default 20)
 *   --seed S            any text; the default is drawn at random and printed
 *   --concurrency C     jobs in flight at once (default min(8, N))
 *   --time-limit S      seconds for the whole run, startup included (default 300 + 10 per job)
 *   --fault-window S    seconds of fault injection from the first submission (default 2.5 per job, 30 to 900)
 *   --weight KIND=N     after the first round, draw that injected fault kind with weight N instead of its
 *                       default (repeatable; e.g. --weight commit-answer-lost=20 for a focused run;
 *                       without it the mix is the default one)
 *   --keep DIR          keep the run's evidence in DIR: run.json (plan, faults with their targets, each
 *                       fault's recovery, every collected job) and the emulators' and toolbox's logs
 *   --quiet             print only faults that found no target, submissions that failed, and the report
 *
 * The seed fixes the job mix, the fault schedule (times, kinds, parameters), the provider waves and
 * the sequence of target draws; which job a fault hits depends on what runs at that moment, so a
 * replay repeats the schedule, not the exact interleaving.
 *
 * `npm run chaos -- --kill-all-once [--seed S]`: a research job run fault-free, then the same kind
 * of job with every function worker SIGKILLed at once mid-job; prints both wall times and the
 * difference, and exits 1 unless the faulted job completed, published exactly one result and took
 * at most 30 s longer (see scripts/chaos/kill-all.ts for its options and settings).
 *
 * The stack uses the ports in firebase.json, so it cannot run beside `npm start` or `npm test` on
 * the same machine (or run it in its own network namespace: `unshare -n`).
 */
import { parseChaosCommand, USAGE, type ChaosCommand } from './chaos/args';
import { runKillAllOnce } from './chaos/kill-all';
import { runChaos } from './chaos/run';

async function main(): Promise<number> {
  let command: ChaosCommand;
  try {
    command = parseChaosCommand(process.argv.slice(2));
  } catch (error) {
    console.error(error instanceof Error ? error.message : String(error));
    return 2;
  }
  if ('help' in command) {
    console.log(USAGE);
    return 0;
  }
  return command.mode === 'kill-all-once' ? runKillAllOnce(command.options) : runChaos(command.options);
}

if (require.main === module) {
  main().then(
    (code) => process.exit(code),
    (error: unknown) => {
      console.error(error instanceof Error ? (error.stack ?? error.message) : String(error));
      process.exit(2);
    },
  );
}
