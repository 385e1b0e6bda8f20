/**
 * The soak's fault injectors. Each finds its target among what runs at that moment (drawn from
 * the seed's target stream), injects, and says what it did; a fault with nothing to hit is
 * recorded as skipped, not counted as injected.
 *
 *   worker-kill               SIGKILL the function worker process that holds a live job or unit
 *                             lease (its PID is in the lease's worker name): the step dies mid-work
 *   lease-expiry              move a live lease's expiresAt into the past (one transaction), then
 *                             run the sweeper at once: the owner is still working when it is reclaimed
 *   duplicate-delivery        enqueue an extra copy of a job's or unit's current step task (no task
 *                             ID, so Cloud Tasks cannot dedupe it), sometimes of the step before
 *   receiver-outage           the receiver's control methods: 503 for everything, connection refused,
 *                             apply-then-hang, fail-before-apply, dropped connections, or hangs whose
 *                             lookups fail too (unknown outcomes nobody can check: a decision)
 *   checkpoint-write-failure  either stall Firestore (SIGSTOP the emulator's JVM for a few seconds,
 *                             then SIGCONT: writes in flight hang, leases run out meanwhile), or cut it
 *                             (the proxy in front of it resets every connection and refuses new ones
 *                             for a few seconds: writes in flight fail with UNAVAILABLE, a commit may
 *                             have landed or not, the engine's write retries run out)
 *   worker-freeze             SIGSTOP the worker holding a live lease (found as worker-kill finds it) for
 *                             longer than the lease, then SIGCONT: its request stays open, so no task comes
 *                             back; the sweeper reclaims the lease, and the woken worker must find itself
 *                             fenced out (every later write refused)
 *   task-loss                 a step's task that never comes back: the tasks emulator's step queue made
 *                             again through its own API (as the stack does at start), which orphans every
 *                             task it held, then SIGKILL the worker holding a live lease: its dispatch
 *                             fails in the orphaned queue, which nobody retries. Only when no task waits
 *                             in the queue; every other queued or running step gets a copy of its task in
 *                             the new queue (a duplicate where its own still runs), so one task is lost
 *   commit-answer-lost        the Firestore proxy drops every answer to a lease holder's connections (its
 *                             requests still reach the emulator) until one of its commits lands (the
 *                             holder's document changes), then resets them: the commit is applied, its
 *                             answer never arrives
 *   rolling-deploy            the functions reloaded mid-run (a touched functions/package.json: firebase-
 *                             tools stops its idle workers and lets the busy ones finish their step before
 *                             they exit, while new workers take the new tasks), one or two of the old busy
 *                             workers stopped (SIGSTOP) first and continued once their leases are gone. The
 *                             new revision is the same build: old beside new, not a change of code
 *
 * Provider error waves are in the functions' PHASELINE_OFFLINE_SETTINGS from the start (windows on
 * the clock); the run only logs them. Submit retries are the submitter's.
 */
import { utimes } from 'node:fs/promises';
import { Timestamp, type DocumentReference, type Firestore } from 'firebase-admin/firestore';
import type { TaskQueue } from 'firebase-admin/functions';
import type { Receiver } from '../receiver';
import type { FirestoreProxy } from './firestore-proxy';
import type { FaultSpec, ReceiverOutageMode } from './plan';
import type { Rng } from './random';
import type { FaultTarget } from './recovery';
import { connectionPorts, listProcesses, signal, stackProcesses, workerPid } from './processes';

export interface FaultOutcome {
  readonly injected: boolean;
  readonly detail: string;
  /** When the fault took effect (wall-clock ms), when not the moment its injection began. */
  readonly atMs?: number;
  /** What it hit, for the recovery figures (none: it is not counted there). */
  readonly targets?: readonly FaultTarget[];
  /** How long after the injection returns the fault still holds (a frozen worker): a lock it holds lasts that long more. */
  readonly holdsOnMs?: number;
  /** A reclaim of the hit claim by this time (wall-clock ms) was the fault's own doing: its worker counts as stopped (see FaultRecord). */
  readonly stopsHolderByMs?: number;
}

export interface InjectorDeps {
  readonly db: Firestore;
  readonly queue: TaskQueue<Record<string, unknown>>;
  readonly receiver: Receiver;
  readonly firestoreProxy: FirestoreProxy;
  /** Runs a sweeper pass; null when it did not finish within a few seconds (it goes on). */
  readonly sweepNow: () => Promise<{ readonly reclaimed: number; readonly unitsReclaimed: number; readonly quarantined: number } | null>;
  readonly rng: Rng;
  readonly self: number;
  /** Makes the tasks emulator's step queue again (same settings): every task it held is orphaned. */
  readonly remakeStepQueue: () => Promise<void>;
  /** Tasks waiting in the step queue, as the tasks emulator counts them (null when it does not say). */
  readonly queueStats: () => Promise<number | null>;
  /** A file of the functions' source that firebase-tools watches: touching it reloads the functions. */
  readonly functionsWatchedFile: string;
  /** How many times firebase-tools has reloaded the functions so far, from its log. */
  readonly functionReloads: () => Promise<number>;
}

/** How long a rolling deploy waits for firebase-tools to say it reloaded the functions. */
const RELOAD_SEEN_WITHIN_MS = 60_000;

export interface Holder {
  readonly ref: DocumentReference;
  readonly jobId: string;
  readonly unit: string | null;
  readonly epoch: number;
  readonly worker: string;
  readonly expiresAtMs: number;
  readonly step: number;
}

/** A step's task as the engine enqueues it, and whose step it is (`unit`: the unit's document key). */
interface StepTask {
  readonly jobId: string;
  readonly unit: string | null;
  readonly payload: Record<string, unknown>;
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** Job and unit documents that hold a lease right now. */
export async function leaseHolders(db: Firestore): Promise<Holder[]> {
  const [jobs, units] = await Promise.all([db.collection('jobs').where('status', '==', 'running').get(), db.collectionGroup('units').where('status', '==', 'running').get()]);
  const holders: Holder[] = [];
  for (const doc of [...jobs.docs, ...units.docs]) {
    const lease = doc.get('lease') as { epoch?: unknown; worker?: unknown; expiresAt?: unknown } | null | undefined;
    if (!lease || typeof lease.epoch !== 'number' || typeof lease.worker !== 'string') continue;
    const isUnit = doc.ref.parent.id === 'units';
    holders.push({
      ref: doc.ref,
      jobId: isUnit ? (doc.ref.parent.parent?.id ?? '') : doc.id,
      unit: isUnit ? doc.id : null,
      epoch: lease.epoch,
      worker: lease.worker,
      expiresAtMs: (lease.expiresAt as { toMillis?: () => number } | undefined)?.toMillis?.() ?? 0,
      step: Number(doc.get('step')),
    });
  }
  return holders.sort((a, b) => (a.ref.path < b.ref.path ? -1 : 1));
}

const name = (holder: { jobId: string; unit: string | null }): string => (holder.unit === null ? `job ${holder.jobId}` : `job ${holder.jobId} unit ${holder.unit}`);

/** The claim a fault hit: recovery waits for a later claim of that scope (or the same one, when none came). */
const claimOf = (holder: Holder): FaultTarget => ({ jobId: holder.jobId, unit: holder.unit, epoch: holder.epoch });

/** Each job once, hit as a job (not a claim): its first progress after the fault counts. */
const jobsOf = (holders: readonly { jobId: string }[]): FaultTarget[] => [...new Set(holders.map((holder) => holder.jobId))].map((jobId) => ({ jobId, unit: null, epoch: null }));

const updateMicros = (time: { seconds: number; nanoseconds: number } | undefined): number => (time === undefined ? Number.NaN : time.seconds * 1_000_000 + Math.floor(time.nanoseconds / 1_000));

export class Injector {
  private firestorePaused: number | null = null;
  /** Worker processes stopped by a freeze or a deploy and not continued yet. */
  private readonly frozen = new Set<number>();
  /** The availability outage in force, if any. */
  private receiverOut: symbol | null = null;
  private readonly restores = new Set<Promise<void>>();

  constructor(private readonly deps: InjectorDeps) {}

  async inject(spec: FaultSpec): Promise<FaultOutcome> {
    switch (spec.kind) {
      case 'worker-kill':
        return this.killWorker();
      case 'lease-expiry':
        return this.expireLease();
      case 'duplicate-delivery':
        return this.duplicate(spec.staleStep);
      case 'receiver-outage':
        return this.withSendingJobs(this.receiverOutage(spec.mode, spec.durationMs, spec.times));
      case 'checkpoint-write-failure':
        return this.withRunningJobs(spec.mode === 'stall' ? () => this.pauseFirestore(spec.durationMs) : () => this.cutFirestore(spec.durationMs));
      case 'worker-freeze':
        return this.freezeWorker(spec.durationMs);
      case 'task-loss':
        return this.loseTask();
      case 'commit-answer-lost':
        return this.loseCommitAnswer();
      case 'rolling-deploy':
        return this.rollingDeploy(spec.freeze, spec.frozenMs);
    }
  }

  /** A receiver outage hits the notify jobs in their send phase at that moment (an armed fault: the next ones to apply). */
  private async withSendingJobs(outcome: Promise<FaultOutcome>): Promise<FaultOutcome> {
    const atMs = Date.now();
    const sending = await this.deps.db
      .collection('jobs')
      .where('status', '==', 'running')
      .get()
      .then(
        (jobs) => jobs.docs.filter((job) => job.get('pipeline') === 'notify' && job.get('phase') === 'send').map((job) => ({ jobId: job.id })),
        () => [],
      );
    return { atMs, targets: jobsOf(sending), ...(await outcome) };
  }

  /** Firestore stalled or cut hits every job holding a lease when it begins. */
  private async withRunningJobs(inject: () => Promise<FaultOutcome>): Promise<FaultOutcome> {
    const holders = await leaseHolders(this.deps.db).catch(() => []);
    const atMs = Date.now();
    return { atMs, targets: jobsOf(holders), ...(await inject()) };
  }

  /** Waits up to `tries` short rounds for a lease to hit: faults are drawn blind to what runs. */
  private async holder(tries: number, accept: (holder: Holder) => boolean = () => true): Promise<Holder | null> {
    for (let round = 0; round < tries; round += 1) {
      const holders = (await leaseHolders(this.deps.db)).filter(accept);
      if (holders.length > 0) return this.deps.rng.pick(holders);
      await sleep(400);
    }
    return null;
  }

  /**
   * The lease holders whose worker is one of this stack's function workers, running (not frozen):
   * waits a few short rounds for one. The number of workers seen, for the skip's detail.
   */
  private async liveWorkerHolders(): Promise<{ holders: Holder[]; workers: number }> {
    let workers = 0;
    for (let round = 0; round < 5; round += 1) {
      const found = stackProcesses(await listProcesses(), this.deps.self).workers;
      workers = found.length;
      const pids = new Set(found.map((row) => row.pid).filter((pid) => !this.frozen.has(pid)));
      const holders = (await leaseHolders(this.deps.db)).filter((holder) => {
        const pid = workerPid(holder.worker);
        return pid !== null && pids.has(pid);
      });
      if (holders.length > 0) return { holders, workers };
      await sleep(400);
    }
    return { holders: [], workers };
  }

  private async liveWorkerHolder(): Promise<{ holder: Holder; pid: number } | FaultOutcome> {
    const { holders, workers } = await this.liveWorkerHolders();
    if (holders.length === 0) return { injected: false, detail: `no step in flight in this stack's ${workers} function workers` };
    const holder = this.deps.rng.pick(holders);
    return { holder, pid: workerPid(holder.worker) ?? 0 };
  }

  private async killWorker(): Promise<FaultOutcome> {
    const found = await this.liveWorkerHolder();
    return 'holder' in found ? this.kill(found.holder) : found;
  }

  private kill(target: Holder): FaultOutcome {
    const pid = workerPid(target.worker);
    const atMs = Date.now();
    if (pid === null || !signal(pid, 'SIGKILL')) return { injected: false, detail: `worker of ${name(target)} was already gone` };
    return { injected: true, atMs, targets: [claimOf(target)], detail: `SIGKILL worker pid ${pid} mid-step (${name(target)}, epoch ${target.epoch}, step ${target.step})` };
  }

  private async freezeWorker(durationMs: number): Promise<FaultOutcome> {
    const found = await this.liveWorkerHolder();
    if (!('holder' in found)) return found;
    const { holder, pid } = found;
    const atMs = Date.now();
    if (!this.freeze(pid)) return { injected: false, detail: `worker of ${name(holder)} was already gone` };
    this.later(durationMs, () => Promise.resolve(this.thaw(pid)));
    return {
      injected: true,
      atMs,
      targets: [claimOf(holder)],
      holdsOnMs: durationMs,
      detail: `SIGSTOP worker pid ${pid} mid-step (${name(holder)}, epoch ${holder.epoch}, step ${holder.step}) for ${durationMs} ms, lease ${Math.round((holder.expiresAtMs - atMs) / 1000)} s from its end`,
    };
  }

  private freeze(pid: number): boolean {
    if (!signal(pid, 'SIGSTOP')) return false;
    this.frozen.add(pid);
    return true;
  }

  private thaw(pid: number): void {
    if (!this.frozen.delete(pid)) return;
    signal(pid, 'SIGCONT');
  }

  /** SIGCONT every worker still stopped; safe to call at any time (signal handlers do). */
  resumeWorkers(): void {
    for (const pid of [...this.frozen]) this.thaw(pid);
  }

  private async loseTask(): Promise<FaultOutcome> {
    const found = await this.liveWorkerHolder();
    if (!('holder' in found)) return found;
    // Remaking the queue loses every task waiting in it too: with a backlog that is a queue wiped, not a task lost.
    const queued = await this.deps.queueStats().catch(() => null);
    if (queued !== 0) return { injected: false, detail: `${queued ?? 'an unknown number of'} tasks wait in the step queue: remaking it would lose them all, not one` };
    // Every other step's task is orphaned with it: each gets a copy in the new queue, so that one task is lost, not all of them.
    const others = (await this.stepTasks()).filter((task) => task.jobId !== found.holder.jobId || (found.holder.unit !== null && task.unit !== found.holder.unit));
    // First the queue (its dispatch of this step is orphaned), then the worker: its failure is never retried.
    await this.deps.remakeStepQueue();
    const outcome = this.kill(found.holder);
    const restored = await Promise.allSettled(others.map((task) => this.deps.queue.enqueue(task.payload)));
    const copies = `${restored.filter((result) => result.status === 'fulfilled').length} of the ${others.length} other steps queued or running given a copy of their task`;
    if (!outcome.injected) return { ...outcome, detail: `step queue made again (no task waiting in it; ${copies}), but ${outcome.detail}` };
    return { ...outcome, detail: `step queue made again (no task waiting in it; the tasks of steps in flight orphaned: ${copies}), then ${outcome.detail}: its task never comes back` };
  }

  /**
   * The task each queued or running step has, as the engine enqueues it: a job's own step, or each
   * queued or running unit of a fanned-out job (a unit's document key is `{phase}~{unit}`).
   */
  private async stepTasks(): Promise<StepTask[]> {
    const db = this.deps.db;
    const [jobs, units] = await Promise.all([db.collection('jobs').where('status', 'in', ['queued', 'running']).get(), db.collectionGroup('units').where('status', 'in', ['queued', 'running']).get()]);
    const fannedOut = new Set(jobs.docs.filter((job) => Boolean(job.get('fanout'))).map((job) => job.id));
    const tasks: StepTask[] = jobs.docs.filter((job) => !fannedOut.has(job.id)).map((job) => ({ jobId: job.id, unit: null, payload: { jobId: job.id, step: Number(job.get('step')) } }));
    for (const unit of units.docs) {
      const jobId = unit.ref.parent.parent?.id ?? '';
      if (!fannedOut.has(jobId)) continue;
      tasks.push({ jobId, unit: unit.id, payload: { jobId, step: Number(unit.get('step')), unit: String(unit.get('unit')), phase: String(unit.get('phase')) } });
    }
    return tasks;
  }

  private async loseCommitAnswer(): Promise<FaultOutcome> {
    const found = await this.liveWorkerHolder();
    if (!('holder' in found)) return found;
    const { holder, pid } = found;
    const proxyPort = Number(this.deps.firestoreProxy.host.split(':').at(-1));
    const ports = await connectionPorts(pid, proxyPort);
    if (ports.size === 0) return { injected: false, detail: `worker pid ${pid} (${name(holder)}) has no connection to Firestore open` };
    const before = await holder.ref.get();
    const lost = this.deps.firestoreProxy.loseAnswers(ports);
    if (lost.connections === 0) return { injected: false, detail: `worker pid ${pid}'s connections to Firestore closed meanwhile` };
    // Its heartbeat (every 2 s) commits to the holder's document at the latest; well within its 8-second lease.
    let landed = false;
    const until = Date.now() + 6_000;
    while (!landed && Date.now() < until) {
      await sleep(150);
      const now = await holder.ref.get().catch(() => null);
      const lease = now?.get('lease') as { worker?: unknown } | null | undefined;
      landed = now !== null && updateMicros(now.updateTime) !== updateMicros(before.updateTime) && (lease?.worker === undefined || lease.worker === holder.worker);
    }
    lost.reset();
    const atMs = Date.now();
    return {
      injected: true,
      atMs,
      // Counted only when a commit's answer was lost: answers to reads alone are another fault.
      targets: landed ? [claimOf(holder)] : [],
      detail:
        `answers on ${lost.connections} connections of worker pid ${pid} (${name(holder)}, epoch ${holder.epoch}) dropped ` +
        (landed ? 'until a commit of its landed on the document, then the connections reset: that commit\'s answer is lost' : 'for 6 s with no commit of its landing on the document, then reset'),
    };
  }

  private async rollingDeploy(freeze: number, frozenMs: number): Promise<FaultOutcome> {
    const { holders, workers } = await this.liveWorkerHolders();
    if (holders.length === 0) return { injected: false, detail: `no step in flight in this stack's ${workers} function workers: a deploy would find no old worker busy` };
    const byPid = new Map<number, Holder>();
    for (const holder of holders) byPid.set(workerPid(holder.worker) ?? 0, holder);
    const chosen: number[] = [];
    const candidates = [...byPid.keys()];
    while (chosen.length < freeze && candidates.length > 0) {
      const pid = this.deps.rng.pick(candidates);
      candidates.splice(candidates.indexOf(pid), 1);
      if (this.freeze(pid)) chosen.push(pid);
    }
    const reloadsBefore = await this.deps.functionReloads();
    const atMs = Date.now();
    // firebase-tools watches the functions' directory; a changed file reloads them (same build: a new revision of it).
    await utimes(this.deps.functionsWatchedFile, new Date(), new Date());
    for (const pid of chosen) this.later(frozenMs, () => Promise.resolve(this.thaw(pid)));
    // A file touched while an earlier reload is still loading folds into it: the next deploy waits for this one to show.
    let reloaded = false;
    while (!reloaded && Date.now() - atMs < RELOAD_SEEN_WITHIN_MS) {
      await sleep(200);
      reloaded = (await this.deps.functionReloads()) > reloadsBefore;
    }
    const frozenHolders = chosen.map((pid) => byPid.get(pid)).filter((holder): holder is Holder => holder !== undefined);
    return {
      injected: true,
      atMs,
      targets: holders.map(claimOf),
      holdsOnMs: frozenMs,
      detail:
        `functions reloaded with ${byPid.size} old workers busy with a step (${holders.map(name).join('; ')}); ` +
        `${chosen.length} of them stopped (SIGSTOP) for ${frozenMs} ms first (${frozenHolders.map((holder) => `pid ${workerPid(holder.worker) ?? '?'}: ${name(holder)}, epoch ${holder.epoch}`).join('; ')}); ` +
        (reloaded ? `the reload showed in the emulators' log after ${Date.now() - atMs} ms` : `no reload in the emulators' log within ${RELOAD_SEEN_WITHIN_MS / 1000} s`),
    };
  }

  private async expireLease(): Promise<FaultOutcome> {
    // A lease already past its time belongs to a worker that died: the sweeper needs no help with it.
    const target = await this.holder(5, (holder) => holder.expiresAtMs > Date.now());
    if (target === null) return { injected: false, detail: 'no live lease to expire' };
    const expiredAt = Date.now() - 1_000;
    const edited = await this.deps.db.runTransaction(async (tx) => {
      const snapshot = await tx.get(target.ref);
      const lease = snapshot.get('lease') as { epoch?: unknown } | null | undefined;
      if (snapshot.get('status') !== 'running' || lease?.epoch !== target.epoch) return false;
      tx.update(target.ref, { 'lease.expiresAt': Timestamp.fromMillis(expiredAt) });
      return true;
    });
    if (!edited) return { injected: false, detail: `${name(target)} moved on before its lease could be expired` };
    const atMs = Date.now();
    const report = await this.deps.sweepNow();
    return {
      injected: true,
      atMs,
      targets: [claimOf(target)],
      // The pass it ran reclaims the lease by the time it answers (a pass still running then is not waited for).
      stopsHolderByMs: Date.now(),
      detail:
        `lease of ${name(target)} (epoch ${target.epoch}, held by a live worker) set to expire in the past; ` +
        (report === null
          ? 'a sweeper pass started (still running after 3 s)'
          : `a sweeper pass: ${report.reclaimed} job and ${report.unitsReclaimed} unit leases reclaimed, ${report.quarantined} quarantined`),
    };
  }

  private async duplicate(staleStep: boolean): Promise<FaultOutcome> {
    const db = this.deps.db;
    const jobs = (await db.collection('jobs').where('status', 'in', ['queued', 'running']).get()).docs;
    if (jobs.length === 0) return { injected: false, detail: 'no queued or running job' };
    const job = this.deps.rng.pick(jobs);
    let payload: Record<string, unknown>;
    if (job.get('fanout')) {
      const units = (await job.ref.collection('units').where('status', 'in', ['queued', 'running']).get()).docs;
      if (units.length === 0) return { injected: false, detail: `job ${job.id} is fanned out with no unit left to run` };
      const unit = this.deps.rng.pick(units);
      const step = Number(unit.get('step'));
      // A unit task names the unit and its phase (the document ID is `{phase}~{unit}`), as the engine enqueues it.
      payload = { jobId: job.id, step: staleStep && step > 0 ? step - 1 : step, unit: String(unit.get('unit')), phase: String(unit.get('phase')) };
    } else {
      const step = Number(job.get('step'));
      payload = { jobId: job.id, step: staleStep && step > 0 ? step - 1 : step };
    }
    const atMs = Date.now();
    await this.deps.queue.enqueue(payload);
    const unit = typeof payload.unit === 'string' && typeof payload.phase === 'string' ? `${payload.phase}~${payload.unit}` : null;
    return { injected: true, atMs, targets: [{ jobId: job.id, unit, epoch: null }], detail: `extra task ${JSON.stringify(payload)} enqueued (${job.get('status') as string}${staleStep ? ', an earlier step' : ''})` };
  }

  /** Runs `restore` after `ms`; a restore that fails is logged by the caller's summary, never thrown. */
  private later(ms: number, restore: () => Promise<void>): void {
    const done: Promise<void> = sleep(ms)
      .then(restore)
      .catch(() => undefined)
      .finally(() => this.restores.delete(done));
    this.restores.add(done);
  }

  /**
   * Receiver outages. Availability (503 for everything, or connection refused) is one outage at a
   * time: a second one while the first lasts finds nothing to do. Armed faults (on the next applies
   * or lookups) stack. Everything goes through the receiver's own control methods, in process: its
   * HTTP control route cannot bring back a receiver that refuses connections.
   */
  private receiverOutage(mode: ReceiverOutageMode, durationMs: number, times: number): Promise<FaultOutcome> {
    const receiver = this.deps.receiver;
    switch (mode) {
      case 'unavailable':
      case 'refused': {
        if (this.receiverOut !== null) return Promise.resolve({ injected: false, detail: 'the receiver is already out' });
        const outage = Symbol(mode);
        this.receiverOut = outage;
        return receiver.setAvailability(mode).then(() => {
          this.later(durationMs, async () => {
            if (this.receiverOut !== outage) return;
            this.receiverOut = null;
            await receiver.setAvailability('up');
          });
          return { injected: true, detail: mode === 'unavailable' ? `receiver answers 503 to everything for ${durationMs} ms` : `receiver refuses connections for ${durationMs} ms` };
        });
      }
      case 'hang-and-lookups-fail':
        receiver.inject({ op: 'apply', mode: 'apply-then-hang', times });
        receiver.inject({ op: 'lookup', mode: 'unavailable', times: times * 4 });
        return Promise.resolve({ injected: true, detail: `next ${times} applies are applied then never answered, and the next ${times * 4} lookups fail` });
      case 'apply-then-hang':
      case 'fail-before-apply':
      case 'drop-connection':
        receiver.inject({ op: 'apply', mode, times });
        return Promise.resolve({ injected: true, detail: `next ${times} applies: ${mode}` });
    }
  }

  private async pauseFirestore(pauseMs: number): Promise<FaultOutcome> {
    const { firestore } = stackProcesses(await listProcesses(), this.deps.self);
    if (!firestore) return { injected: false, detail: 'the Firestore emulator was not started by this run (FIRESTORE_EMULATOR_HOST was set)' };
    if (!signal(firestore.pid, 'SIGSTOP')) return { injected: false, detail: 'the Firestore emulator process is gone' };
    this.firestorePaused = firestore.pid;
    try {
      await sleep(pauseMs);
    } finally {
      this.resumeFirestore();
    }
    return { injected: true, detail: `Firestore emulator (pid ${firestore.pid}) stopped (SIGSTOP) for ${pauseMs} ms, then continued: requests in flight stall` };
  }

  private async cutFirestore(durationMs: number): Promise<FaultOutcome> {
    this.deps.firestoreProxy.cut(durationMs);
    await sleep(durationMs);
    return { injected: true, detail: `every connection to Firestore reset, and new ones for ${durationMs} ms: requests in flight fail (UNAVAILABLE)` };
  }

  /** SIGCONT a paused Firestore emulator; safe to call at any time (signal handlers do). */
  resumeFirestore(): void {
    if (this.firestorePaused === null) return;
    signal(this.firestorePaused, 'SIGCONT');
    this.firestorePaused = null;
  }

  /** Ends every fault still in force: Firestore running, every frozen worker continued, the receiver up, no armed receiver faults. */
  async restoreAll(): Promise<void> {
    this.resumeFirestore();
    // Frozen workers are continued on their own timers (awaited below): they must wake into a fenced world, not be left stopped.
    await Promise.allSettled([...this.restores]);
    this.resumeWorkers();
    this.deps.receiver.clearFaults();
    this.receiverOut = null;
    await this.deps.receiver.setAvailability('up');
  }
}
