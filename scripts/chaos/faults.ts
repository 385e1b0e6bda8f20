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
 *
 * Provider error waves are in the functions' PHASELINE_OFFLINE_SETTINGS from the start (windows on
 * the clock); the run only logs them. Submit retries are the submitter's.
 */
import { Timestamp, type DocumentReference, type Firestore } from 'firebase-admin/firestore';
import type { TaskQueue } from 'firebase-admin/functions';
import type { Receiver } from '../receiver';
import type { FirestoreProxy } from './firestore-proxy';
import type { FaultSpec, ReceiverOutageMode } from './plan';
import type { Rng } from './random';
import { listProcesses, signal, stackProcesses, workerPid } from './processes';

export interface FaultOutcome {
  readonly injected: boolean;
  readonly detail: string;
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
}

export interface Holder {
  readonly ref: DocumentReference;
  readonly jobId: string;
  readonly unit: string | null;
  readonly epoch: number;
  readonly worker: string;
  readonly expiresAtMs: number;
  readonly step: number;
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

export class Injector {
  private firestorePaused: number | null = null;
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
        return this.receiverOutage(spec.mode, spec.durationMs, spec.times);
      case 'checkpoint-write-failure':
        return spec.mode === 'stall' ? this.pauseFirestore(spec.durationMs) : this.cutFirestore(spec.durationMs);
    }
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

  private async killWorker(): Promise<FaultOutcome> {
    let workers = 0;
    for (let round = 0; round < 5; round += 1) {
      const found = stackProcesses(await listProcesses(), this.deps.self).workers;
      workers = found.length;
      const pids = new Set(found.map((row) => row.pid));
      const holders = (await leaseHolders(this.deps.db)).filter((holder) => {
        const pid = workerPid(holder.worker);
        return pid !== null && pids.has(pid);
      });
      if (holders.length > 0) return this.kill(this.deps.rng.pick(holders));
      await sleep(400);
    }
    return { injected: false, detail: `no step in flight in this stack's ${workers} function workers` };
  }

  private kill(target: Holder): FaultOutcome {
    const pid = workerPid(target.worker);
    if (pid === null || !signal(pid, 'SIGKILL')) return { injected: false, detail: `worker of ${name(target)} was already gone` };
    return { injected: true, detail: `SIGKILL worker pid ${pid} mid-step (${name(target)}, epoch ${target.epoch}, step ${target.step})` };
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
    const report = await this.deps.sweepNow();
    return {
      injected: true,
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
    await this.deps.queue.enqueue(payload);
    return { injected: true, detail: `extra task ${JSON.stringify(payload)} enqueued (${job.get('status') as string}${staleStep ? ', an earlier step' : ''})` };
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

  /** Ends every fault still in force: Firestore running, the receiver up, no armed receiver faults. */
  async restoreAll(): Promise<void> {
    this.resumeFirestore();
    await Promise.allSettled([...this.restores]);
    this.deps.receiver.clearFaults();
    this.receiverOut = null;
    await this.deps.receiver.setAvailability('up');
  }
}
