/**
 * What a research job waits for between its model calls: one fault-free job through the real
 * runner on the emulator (bench/lib/phaseline-driver.ts), every RPC of the engine's Firestore client
 * and every model call timestamped and tagged with the task (worker) that made it. Printed per
 * task: the gaps between its model calls (before the first, between two, after the last) and the
 * RPCs that ran in each gap, and at the end the critical path of the job: the job's own tasks and
 * the fan-out's slowest unit, with its model time, its bookkeeping time and the round trips that
 * ran where no model call of their task was running (the ones the job waited for).
 *
 *   npx tsx bench/critical-path.ts [--latency 200] [--rpc-delay 0] [--input 0] [--quiet] [--unmetered]
 *
 * `--unmetered` runs the job without the owner's spend cap (a ledger that reads and writes nothing):
 * what the cap's check before every model call costs is the difference.
 *
 * Times move with the machine's load. `--rpc-delay 50` holds every RPC back that long before it is
 * sent, like a slow network: the emulator's own time (and the machine's load) then hardly matters,
 * and the time between model calls on the critical path, divided by the delay, counts the round
 * trips the job waited for one after another. Not part of `npm run bench`.
 */
import type { EventEmitter } from 'node:events';
import { resolveEngineOptions } from '../functions/src/core/options';
import { firestoreCircuit } from '../functions/src/store/provider-circuit';
import type { ChatRequest } from '../functions/src/agent/provider';
import type { StepTask } from '../functions/src/core/job';
import type { RunnerDeps } from '../functions/src/engine/step/deps';
import type { SpendLedger } from '../functions/src/store/quota-documents';
import { currentWorkerName, promptIdOf } from './lib/faults';
import { openProject, startBenchFirestore } from './lib/firestore';
import { PhaselineDriver } from './lib/phaseline-driver';
import { RESEARCH_INPUTS, researchKit } from './lib/workload';

/** A spend ledger with no cap: every check allows the call, no read and no write. */
const NO_CAP = {
  firstCheck: () => Promise.resolve({ facts: { anonymous: false, override: null, copySeen: 'none' }, today: { spentUsd: 0, capUsd: Number.POSITIVE_INFINITY } }),
  today: () => Promise.resolve({ spentUsd: 0, capUsd: Number.POSITIVE_INFINITY, landed: new Set<string>() }),
  charge: () => Promise.resolve(),
} as unknown as SpendLedger;

process.env.METADATA_SERVER_DETECTION ??= 'none';
process.setSourceMapsEnabled(false);

function option(name: string): string | undefined {
  const index = process.argv.indexOf(name);
  return index === -1 ? undefined : process.argv[index + 1];
}

interface Span {
  readonly worker: string;
  readonly startMs: number;
  endMs: number;
  readonly label: string;
}

interface Internals {
  request(method: string, request: unknown, tag: string, retryCodes?: unknown): Promise<unknown>;
  requestStream(method: string, bidirectional: boolean, request: unknown, tag: string): Promise<EventEmitter>;
}

/** `jobs/{id}/x/y` as `x`, a path outside the job by its collection. */
function shortPath(name: string | undefined): string {
  if (name === undefined) return '?';
  const at = name.indexOf('/documents/');
  const path = at === -1 ? name : name.slice(at + '/documents/'.length);
  const parts = path.split('/');
  if (parts[0] === 'jobs') return parts.length <= 2 ? 'job' : (parts[2] ?? '?');
  return parts[0] ?? '?';
}

function describeRpc(method: string, body: unknown): string {
  const wire = body as {
    writes?: readonly { update?: { name?: string }; delete?: string }[];
    documents?: readonly string[];
    parent?: string;
    structuredQuery?: { from?: readonly { collectionId?: string }[] };
    transaction?: unknown;
    newTransaction?: unknown;
  } | null;
  const tx = wire?.transaction !== undefined || wire?.newTransaction !== undefined ? ' (tx)' : '';
  if (method === 'commit') {
    const kinds = [...new Set((wire?.writes ?? []).map((write) => shortPath(write.update?.name ?? write.delete)))];
    return `commit[${kinds.join(',')}]${tx}`;
  }
  if (method === 'batchGetDocuments') return `get[${[...new Set((wire?.documents ?? []).map(shortPath))].join(',')}]${tx}`;
  if (method === 'runQuery') return `query[${shortPath(`${wire?.parent ?? ''}/${wire?.structuredQuery?.from?.[0]?.collectionId ?? '?'}/x`)}]${tx}`;
  return method;
}

async function main(): Promise<void> {
  const latencyMs = Number(option('--latency') ?? 200);
  const input = RESEARCH_INPUTS[Number(option('--input') ?? 0)];
  if (input === undefined) throw new Error('no such input');
  const quiet = process.argv.includes('--quiet');
  const unmetered = process.argv.includes('--unmetered');
  const rpcDelayMs = Number(option('--rpc-delay') ?? 0);
  const held = (): Promise<void> => (rpcDelayMs > 0 ? new Promise((resolve) => setTimeout(resolve, rpcDelayMs)) : Promise.resolve());
  const firestore = await startBenchFirestore();
  const project = openProject('critical-path');
  const rpcs: Span[] = [];
  const calls: Span[] = [];
  const internals = project.db as unknown as Internals;
  const request = internals.request.bind(project.db);
  const requestStream = internals.requestStream.bind(project.db);
  internals.request = async (method, body, tag, retryCodes) => {
    const span: Span = { worker: currentWorkerName() ?? '-', startMs: performance.now(), endMs: Number.NaN, label: describeRpc(method, body) };
    rpcs.push(span);
    try {
      await held();
      return await request(method, body, tag, retryCodes);
    } finally {
      span.endMs = performance.now();
    }
  };
  internals.requestStream = async (method, bidirectional, body, tag) => {
    const span: Span = { worker: currentWorkerName() ?? '-', startMs: performance.now(), endMs: Number.NaN, label: describeRpc(method, body) };
    rpcs.push(span);
    await held();
    const stream = await requestStream(method, bidirectional, body, tag);
    const emit = stream.emit.bind(stream);
    stream.emit = (event: string | symbol, ...args: unknown[]): boolean => {
      if ((event === 'end' || event === 'error') && Number.isNaN(span.endMs)) span.endMs = performance.now();
      return emit(event, ...args);
    };
    return stream;
  };
  try {
    // A warm-up job first (connections, JIT), then the one traced.
    for (const traced of [false, true]) {
      await project.reset();
      rpcs.length = 0;
      calls.length = 0;
      const driver = new PhaselineDriver(project, resolveEngineOptions());
      if (unmetered) {
        // The driver's own deps, with a spend ledger that allows every call and writes nothing.
        const deps = (driver as unknown as { deps: (...args: unknown[]) => RunnerDeps }).deps.bind(driver);
        (driver as unknown as { deps: (...args: unknown[]) => RunnerDeps }).deps = (...args) => ({ ...deps(...args), spendLedger: NO_CAP });
      }
      const tasks: StepTask[] = [];
      const takeDue = driver.queue.takeDue.bind(driver.queue);
      driver.queue.takeDue = (nowMs) => {
        const due = takeDue(nowMs);
        if (due) tasks.push(due.task);
        return due;
      };
      const kit = researchKit(driver.clock, [], firestoreCircuit(project.db, 'offline'), latencyMs);
      const chat = kit.provider.chat.bind(kit.provider);
      kit.provider.chat = async (chatRequest: ChatRequest) => {
        const span: Span = { worker: currentWorkerName() ?? '-', startMs: performance.now(), endMs: Number.NaN, label: promptIdOf(chatRequest) };
        calls.push(span);
        try {
          return await chat(chatRequest);
        } finally {
          span.endMs = performance.now();
        }
      };
      const run = await driver.runJob(kit.registry, 'research', input);
      if (traced) report(run.wallMs, run.status, tasks, rpcs, calls, latencyMs, rpcDelayMs, quiet);
    }
  } finally {
    await project.close();
    await firestore.stop();
  }
}

/** The longest chain of these RPCs that ran one after another (each started after the one before ended): what was waited for in turn. */
function serialDepth(spans: readonly Span[]): number {
  let depth = 0;
  let freeAt = -Infinity;
  for (const span of [...spans].sort((a, b) => a.endMs - b.endMs)) {
    if (span.startMs < freeAt) continue;
    depth += 1;
    freeAt = span.endMs;
  }
  return depth;
}

interface Gap {
  readonly worker: string;
  readonly where: string;
  readonly startMs: number;
  readonly endMs: number;
  readonly rpcs: readonly Span[];
}

function report(wallMs: number, status: string, tasks: readonly StepTask[], rpcs: readonly Span[], calls: readonly Span[], latencyMs: number, rpcDelayMs: number, quiet: boolean): void {
  const workers = tasks.map((task, index) => ({ name: `bench-worker-${index + 1}`, task }));
  const t0 = Math.min(...rpcs.map((span) => span.startMs));
  const at = (ms: number): string => `${Math.round(ms - t0)}`.padStart(6);
  const gaps: Gap[] = [];
  const lanes = new Map<string, { model: number; span: [number, number]; gaps: Gap[] }>();
  for (const { name, task } of workers) {
    const own = rpcs.filter((span) => span.worker === name).sort((a, b) => a.startMs - b.startMs);
    const ownCalls = calls.filter((span) => span.worker === name).sort((a, b) => a.startMs - b.startMs);
    if (own.length === 0) continue;
    const startMs = Math.min(own[0]?.startMs ?? Infinity, ownCalls[0]?.startMs ?? Infinity);
    const endMs = Math.max(...own.map((span) => span.endMs), ...ownCalls.map((span) => span.endMs));
    const bounds: { where: string; from: number; to: number }[] = [];
    let from = startMs;
    let where = 'start';
    for (const call of ownCalls) {
      bounds.push({ where: `${where} → ${call.label}`, from, to: call.startMs });
      from = call.endMs;
      where = call.label;
    }
    bounds.push({ where: `${where} → end`, from, to: endMs });
    const taskGaps = bounds.map(({ where: label, from: gapStart, to: gapEnd }) => ({
      worker: name,
      where: label,
      startMs: gapStart,
      endMs: gapEnd,
      // RPCs that ran mostly where no model call of this task ran: the task waited for them.
      rpcs: own.filter((span) => Math.min(span.endMs, gapEnd) - Math.max(span.startMs, gapStart) > (span.endMs - span.startMs) / 2),
    }));
    gaps.push(...taskGaps);
    const lane = task.unit ?? 'job';
    const entry = lanes.get(lane) ?? { model: 0, span: [startMs, endMs], gaps: [] };
    entry.model += ownCalls.reduce((sum, call) => sum + (call.endMs - call.startMs), 0);
    entry.span = [Math.min(entry.span[0], startMs), Math.max(entry.span[1], endMs)];
    entry.gaps.push(...taskGaps);
    lanes.set(lane, entry);
    if (!quiet) {
      const label = task.unit ? `unit ${task.unit} step ${task.step}` : `job step ${task.step}`;
      console.log(`\n${name} (${label}): ${ownCalls.length} model calls, ${own.length} RPCs, ${at(startMs)} → ${at(endMs)} ms`);
      for (const gap of taskGaps) {
        const names = gap.rpcs.map((span) => `${span.label} ${Math.round(span.endMs - span.startMs)}`).join('; ');
        console.log(`  ${at(gap.startMs)} +${String(Math.round(gap.endMs - gap.startMs)).padStart(4)} ms  ${gap.where.padEnd(24)} ${serialDepth(gap.rpcs)} serial of ${gap.rpcs.length} RPC: ${names}`);
      }
    }
  }
  // The critical path: the job's own tasks, and the fan-out's slowest unit (its span from its first event to its last).
  const units = [...lanes.entries()].filter(([lane]) => lane !== 'job');
  const slowest = units.sort((a, b) => b[1].span[1] - b[1].span[0] - (a[1].span[1] - a[1].span[0]))[0];
  const job = lanes.get('job');
  const critical = [job, slowest?.[1]].filter((lane) => lane !== undefined);
  const criticalGaps = critical.flatMap((lane) => lane.gaps);
  const criticalCalls = calls.filter((call) => criticalGaps.some((gap) => gap.worker === call.worker)).length;
  const criticalModelMs = critical.reduce((sum, lane) => sum + lane.model, 0);
  const serialRpcs = criticalGaps.reduce((sum, gap) => sum + serialDepth(gap.rpcs), 0);
  const gapRpcs = criticalGaps.reduce((sum, gap) => sum + gap.rpcs.length, 0);
  const gapMs = criticalGaps.reduce((sum, gap) => sum + (gap.endMs - gap.startMs), 0);
  const byLabel = new Map<string, number>();
  for (const gap of criticalGaps) for (const span of gap.rpcs) byLabel.set(span.label, (byLabel.get(span.label) ?? 0) + 1);
  const sections = new Set(calls.map((call) => call.label)).size;
  const criticalSections = new Set(calls.filter((call) => criticalGaps.some((gap) => gap.worker === call.worker)).map((call) => call.label)).size;
  console.log(`\njob ${status}: wall ${Math.round(wallMs)} ms; ${calls.length} model calls at ${latencyMs} ms, ${criticalCalls} of them on the critical path (job tasks + slowest unit ${slowest?.[0] ?? '-'})`);
  console.log(
    `critical path (${criticalSections} of ${sections} sections): model ${Math.round(criticalModelMs)} ms, between model calls ${Math.round(gapMs)} ms; ` +
      `round trips waited for in turn: ${serialRpcs} (${(serialRpcs / criticalSections).toFixed(1)} per section on it), of ${gapRpcs} RPCs that ran between its model calls`,
  );
  if (rpcDelayMs > 0) console.log(`at ${rpcDelayMs} ms held back per RPC: ${(gapMs / rpcDelayMs).toFixed(1)} round trips' worth between model calls on the critical path (${(gapMs / rpcDelayMs / criticalSections).toFixed(1)} per section on it)`);
  console.log(`all tasks: ${rpcs.length} RPCs, ${gaps.reduce((sum, gap) => sum + gap.rpcs.length, 0)} of them between their task's model calls`);
  console.log('RPCs between model calls on the critical path, by kind:');
  for (const [label, count] of [...byLabel.entries()].sort((a, b) => b[1] - a[1])) console.log(`  ${String(count).padStart(4)}  ${label}`);
}

main().catch((error: unknown) => {
  console.error(error);
  process.exitCode = 1;
});
