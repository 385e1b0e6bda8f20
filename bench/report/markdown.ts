/** bench/results/results.md: the tables, where Phaseline is not ahead, and how it was measured. */
import { redeliveryDelayMs, STEP_QUEUE } from '../lib/cloud-tasks';
import type { Implementation } from '../scenarios/compare';
import { REAL_CALL_MS, type CapacitySummary } from './capacity';
import type { BenchResults } from './results';
import { anchor, SECTION } from './sections';
import { breakEvenLatencyMs, type ImplementationSummary } from './summary';
import type { TargetCheck } from './targets';

export const LABELS: Readonly<Record<Implementation, string>> = {
  phaseline: 'Phaseline',
  'whole-job': 'Retry the whole job',
  'phase-checkpoints': 'Phase checkpoints only',
  'in-memory': 'In-process, no durability',
  'phaseline-lost-task': "Phaseline, the killed worker's task lost (sweeper only)",
};

export function fmt(value: number, digits = 0): string {
  if (!Number.isFinite(value)) return 'n/a';
  return value.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
}

/** `kind 1.2, kind 0.4` by count, largest first: where the reads or writes of a section go; `n/a` when not recorded. */
function byDocument(perSection: Readonly<Record<string, number>>): string {
  const rows = Object.entries(perSection).filter(([, count]) => count > 0).sort((a, b) => b[1] - a[1]);
  return rows.length === 0 ? 'n/a' : rows.map(([kind, count]) => `${kind} ${fmt(count, 1)}`).join(', ');
}

const seconds = (ms: number, digits = 0): string => `${fmt(ms / 1000, digits)} s`;

/** A wall-time ratio as the time it adds: `+3.04 %`, `+15.8 %`, `+958 %` (more digits near the 3 % target). */
export function addedPercent(ratio: number): string {
  const percent = (ratio - 1) * 100;
  const size = Math.abs(percent);
  return `${percent >= 0 ? '+' : '−'}${fmt(size, size < 10 ? 2 : size < 100 ? 1 : 0)} %`;
}
const arrow = (before: number, after: number, digits = 0): string => `${fmt(before, digits)} → ${fmt(after, digits)}`;

function table(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const line = (cells: readonly string[]): string => `| ${cells.join(' | ')} |`;
  return [line(header), line(header.map(() => '---')), ...rows.map(line)].join('\n');
}

function outcomes(record: Readonly<Record<string, number>>): string {
  return Object.entries(record)
    .map(([name, count]) => `${name} ×${count}`)
    .join(', ');
}

const ORDER: readonly Implementation[] = ['phaseline', 'whole-job', 'phase-checkpoints'];

function ordered(summary: readonly ImplementationSummary[]): ImplementationSummary[] {
  return ORDER.flatMap((name) => summary.filter((row) => row.implementation === name));
}

/** Who brought the work of lost workers of one kind back, e.g. "redelivered task ×10". */
function recoveredBy(item: ImplementationSummary, kind: 'killed' | 'frozen'): string {
  return Object.entries(item.recoveredBy)
    .filter(([key]) => key.startsWith(`${kind}: `))
    .map(([key, count]) => `${key.slice(kind.length + 2)} ×${count}`)
    .join(', ');
}

/** The main table: one column per implementation, one row per figure. */
export function comparisonTable(summary: readonly ImplementationSummary[]): string {
  const columns = ordered(summary);
  const lostTask = summary.find((item) => item.implementation === 'phaseline-lost-task');
  const row = (label: string, cell: (item: ImplementationSummary) => string): string[] => [label, ...columns.map(cell)];
  return table(
    ['Per job (median of repeats)', ...columns.map((item) => LABELS[item.implementation])],
    [
      row('Model calls, fault-free → with faults', (item) => arrow(item.modelCallsFaultFree, item.modelCallsFaulted, 1)),
      row('**Model calls repeated because of faults** (same request sent again)', (item) => `**${fmt(item.repeatedModelCalls, 1)}**`),
      row('Tool calls, fault-free → with faults', (item) => arrow(item.toolCallsFaultFree, item.toolCallsFaulted, 1)),
      row('**Tool calls repeated because of faults** (same call run again)', (item) => `**${fmt(item.repeatedToolCalls, 1)}**`),
      row('Wall time to completion, fault-free', (item) => `${fmt(item.wallMsFaultFree)} ms`),
      row('**Wall time to completion, with faults**', (item) => `**${fmt(item.wallMsFaulted)} ms**`),
      row('Time to completion with faults, wall time plus virtual waits', (item) => seconds(item.elapsedMsFaulted)),
      row('Recovery wait with faults (virtual: leases, backoff, redelivery)', (item) =>
        [
          `${seconds(item.virtualWaitMsFaulted)}:`,
          Object.entries(item.waitsFaulted)
            .map(([cause, ms]) => `${cause} ${seconds(ms)}`)
            .join('; '),
        ].join(' '),
      ),
      row('**Recovery wait per killed worker** (virtual: from the kill until its work runs again)', (item) =>
        item.implementation === 'phaseline'
          ? `**${seconds(item.recoveryMsPerKilledWorker)}** (${recoveredBy(item, 'killed')})`
          : `**${seconds(item.recoveryMsPerKilledWorker)}** (redelivery)`,
      ),
      // The baselines have no sweeper: a task that never comes back leaves their job where it stood, by construction (not measured).
      row('Recovery wait per lost task (virtual: a killed worker whose task never comes back; Phaseline faulted runs again with every killed task lost)', (item) =>
        item.implementation === 'phaseline'
          ? lostTask
            ? `${seconds(lostTask.recoveryMsPerKilledWorker)} (${recoveredBy(lostTask, 'killed')})`
            : 'not run (lostTaskVariant off)'
          : 'never: only its task runs it again (no sweeper; by construction, not measured)',
      ),
      row('Recovery wait per frozen worker (virtual: from the freeze until its work runs again)', (item) =>
        item.implementation === 'phaseline'
          ? `${seconds(item.recoveryMsPerFrozenWorker)} (${recoveredBy(item, 'frozen')})`
          : `${seconds(item.recoveryMsPerFrozenWorker)} (function timeout, then redelivery)`,
      ),
      row('**Published results per job, with faults**', (item) => `**${fmt(item.publishedFaulted, 1)}**`),
      row('Firestore reads per job, fault-free → with faults', (item) => arrow(item.readsFaultFree, item.readsFaulted)),
      row('Firestore writes per job, fault-free → with faults', (item) => arrow(item.writesFaultFree, item.writesFaulted)),
      row('Task deliveries with faults', (item) => fmt(item.deliveriesFaulted, 1)),
      row('Outcomes with faults', (item) => outcomes(item.outcomesFaulted)),
      row('What frozen workers did on waking', (item) => outcomes(item.zombieOutcomes) || '—'),
    ],
  );
}

function find(summary: readonly ImplementationSummary[], name: Implementation): ImplementationSummary | undefined {
  return summary.find((item) => item.implementation === name);
}

/** Figures where a baseline does at least as well as Phaseline, each with the reason. */
export function notAhead(results: Pick<BenchResults, 'comparison' | 'sensitivity' | 'overhead' | 'writeRate' | 'meta'>): string[] {
  const notes: string[] = [];
  const summary = results.comparison?.summary ?? [];
  const ours = find(summary, 'phaseline');
  if (!ours) return notes;
  const baselines = summary.filter((item) => item.implementation === 'whole-job' || item.implementation === 'phase-checkpoints');
  const beaten = (figure: (item: ImplementationSummary) => number, source: readonly ImplementationSummary[] = baselines, mine: ImplementationSummary = ours) =>
    source.filter((item) => figure(item) <= figure(mine));
  const names = (items: readonly ImplementationSummary[], figure: (item: ImplementationSummary) => string) =>
    items.map((item) => `${LABELS[item.implementation]} ${figure(item)}`).join(', ');
  const latency = results.meta.modelLatencyMs;

  const cleanWall = beaten((item) => item.wallMsFaultFree);
  if (cleanWall.length > 0) {
    notes.push(
      `**Wall time without faults.** Phaseline ${fmt(ours.wallMsFaultFree)} ms per job against ${names(cleanWall, (item) => `${fmt(item.wallMsFaultFree)} ms`)}. ` +
        `Every model answer and every tool result is saved before the next call, each save one commit conditioned on the claim ` +
        `(${fmt(results.overhead?.commitsPerSection ?? Number.NaN, 1)} durable commits and ${fmt(results.overhead?.transactionsPerSection ?? Number.NaN, 1)} transactions per agent section), and steps hand off through the queue; ` +
        `at ${latency} ms per model call that bookkeeping, not the model, is most of the time.`,
    );
  }
  const faultedWall = beaten((item) => item.wallMsFaulted);
  if (faultedWall.length > 0) {
    const sensitivity = results.sensitivity;
    const slow = sensitivity ? find(sensitivity.summary, 'phaseline') : undefined;
    const slowBeaten = sensitivity && slow ? beaten((item) => item.wallMsFaulted, sensitivity.summary.filter((item) => item.implementation !== 'phaseline'), slow) : [];
    const crossings =
      sensitivity && results.comparison
        ? slowBeaten.flatMap((item) => {
            const latencyMs = breakEvenLatencyMs(results.comparison?.samples ?? [], latency, sensitivity.samples, sensitivity.latencyMs, item.implementation);
            return latencyMs === null ? [] : [`${LABELS[item.implementation]} at about ${fmt(latencyMs)} ms per call`];
          })
        : [];
    const tail = !sensitivity || !slow
      ? ''
      : slowBeaten.length === 0
        ? ` At ${sensitivity.latencyMs} ms per call the order turns: Phaseline ${fmt(slow.wallMsFaulted)} ms against ${names(sensitivity.summary.filter((item) => item.implementation !== 'phaseline'), (item) => `${fmt(item.wallMsFaulted)} ms`)}; real model calls take seconds.`
        : ` Even at ${sensitivity.latencyMs} ms per call: Phaseline ${fmt(slow.wallMsFaulted)} ms against ${names(slowBeaten, (item) => `${fmt(item.wallMsFaulted)} ms`)}` +
          `${sensitivity.summary.some((item) => item.implementation !== 'phaseline' && item.wallMsFaulted > slow.wallMsFaulted) ? ` (but ahead of ${names(sensitivity.summary.filter((item) => item.implementation !== 'phaseline' && item.wallMsFaulted > slow.wallMsFaulted), (item) => `${fmt(item.wallMsFaulted)} ms`)})` : ''}: ` +
          `Phaseline pays its bookkeeping on every section (fault-free it is already ${fmt(slow.wallMsFaultFree - Math.min(...sensitivity.summary.filter((item) => item.implementation !== 'phaseline').map((item) => item.wallMsFaultFree)))} ms slower per job), ` +
          "and its killed expert resumes only when a redelivered task finds the dead worker's heartbeat stale, after its sibling has finished, so the sections it still has to write overlap with nothing; " +
          'the phase-level baseline restarts both experts together, so its repeated calls run two at a time. ' +
          (crossings.length > 0
            ? `A straight line through the two latencies (same input) puts the crossing with ${crossings.join(' and with ')}: real model calls take seconds.`
            : 'The two latencies do not show a crossing.');
    notes.push(
      `**Wall time with faults, at ${latency} ms per model call.** Phaseline ${fmt(ours.wallMsFaulted)} ms against ${names(faultedWall, (item) => `${fmt(item.wallMsFaulted)} ms`)}: ` +
        `repeating up to ${fmt(Math.max(...faultedWall.map((item) => item.repeatedModelCalls)) - ours.repeatedModelCalls)} more model calls costs less than checkpointing every step when a call takes ${latency} ms ` +
        `(wall time here leaves out the virtual waits, which the row "time to completion … plus virtual waits" adds back).${tail}`,
    );
  }
  const killed = ours.recoveryMsPerKilledWorker;
  const fasterAfterKill = baselines.filter((item) => item.recoveryMsPerKilledWorker < killed);
  if (fasterAfterKill.length > 0) {
    const { staleHeartbeatSeconds, clockSkewSeconds } = results.meta.engineOptions;
    const takeoverSeconds = (staleHeartbeatSeconds ?? Number.NaN) + (clockSkewSeconds ?? 0);
    const firstArrival = redeliveryDelayMs(1) / 1000;
    notes.push(
      `**Recovery wait after a killed worker.** Phaseline's work came back ${seconds(killed)} (virtual) after the kill, against ${names(fasterAfterKill, (item) => seconds(item.recoveryMsPerKilledWorker))}. ` +
        `Cloud Tasks delivers the killed request's task again ${fmt(firstArrival)} s after the kill; ` +
        `a delivery that finds the dead worker's last heartbeat younger than ${fmt(takeoverSeconds)} s (the stale age plus the clock-skew allowance) cannot tell it from a slow live one, so it waits in its request until the heartbeat is that old and takes over with a new epoch ` +
        '(the bench kills a worker right after its heartbeat, the longest case). ' +
        'A plain retry starts again at the first redelivery, and repeats the work the rows above count.',
    );
  }
  const frozen = ours.recoveryMsPerFrozenWorker;
  const fasterAfterFreeze = baselines.filter((item) => item.recoveryMsPerFrozenWorker < frozen);
  if (fasterAfterFreeze.length > 0) {
    notes.push(`**Recovery wait after a frozen worker.** Phaseline ${seconds(frozen)} (virtual) against ${names(fasterAfterFreeze, (item) => seconds(item.recoveryMsPerFrozenWorker))}.`);
  }
  const wait = beaten((item) => item.virtualWaitMsFaulted);
  if (wait.length > 0) {
    notes.push(`**Recovery wait per job, all causes.** Phaseline ${seconds(ours.virtualWaitMsFaulted)} (virtual) against ${names(wait, (item) => seconds(item.virtualWaitMsFaulted))}.`);
  }
  const reads = beaten((item) => item.readsFaulted);
  const writes = beaten((item) => item.writesFaulted);
  if (reads.length > 0 || writes.length > 0) {
    notes.push(
      `**Firestore operations.** Phaseline reads ${fmt(ours.readsFaultFree)} and writes ${fmt(ours.writesFaultFree)} documents per fault-free job ` +
        `(${fmt(results.overhead?.writesPerSection ?? Number.NaN, 1)} writes per agent section) against ${names(baselines, (item) => `${fmt(item.readsFaultFree)} / ${fmt(item.writesFaultFree)}`)}. ` +
        `That is the price of section checkpoints and durable transcripts: each save writes its transcript document and the claim slot whose update time proves ownership, ` +
        `every step reads the checkpoints of the phases before it, and the timeline gets an event per transition (the split by document is in section 2).`,
    );
  }
  const repeated = beaten((item) => item.repeatedModelCalls);
  if (repeated.length > 0) notes.push(`**Repeated model calls.** ${names(repeated, (item) => fmt(item.repeatedModelCalls, 1))} against Phaseline ${fmt(ours.repeatedModelCalls, 1)}.`);
  const repeatedTools = beaten((item) => item.repeatedToolCalls);
  if (repeatedTools.length > 0) notes.push(`**Repeated tool calls.** ${names(repeatedTools, (item) => fmt(item.repeatedToolCalls, 1))} against Phaseline ${fmt(ours.repeatedToolCalls, 1)}.`);
  const published = baselines.filter((item) => Math.abs(item.publishedFaulted - 1) <= Math.abs(ours.publishedFaulted - 1));
  if (published.length > 0) notes.push(`**Published results.** ${names(published, (item) => fmt(item.publishedFaulted, 1))} against Phaseline ${fmt(ours.publishedFaulted, 1)}.`);
  const busiest = [...(results.writeRate?.summary ?? [])].sort((a, b) => b.maxJobWritesInOneSecond - a.maxJobWritesInOneSecond)[0];
  if (busiest && busiest.maxJobWritesInOneSecond > 1) {
    notes.push(
      `**Job-document writes in the busiest second.** Sustained, progress reaches the job document at ${fmt(busiest.progressWritesPerSecond, 2)} writes/s ` +
        `(at ${fmt(busiest.sectionsPerSecond, 1)} sections/s; never less than ${fmt(busiest.minProgressGapMs)} ms apart), but ${busiest.maxJobWritesInOneSecond} writes fell within one second: ` +
        'the first progress write follows the claim at once (the flusher has no earlier write to space it from), and the hand-off can follow the last one. ' +
        'Firestore tolerates such bursts; it is the sustained rate that must stay near one a second.',
    );
  }
  return notes;
}

const usd = (value: number): string => (Number.isFinite(value) ? `$${value.toFixed(value < 1 ? 3 : 2)}` : 'n/a');

/** The capacity and cost model: operations and cost per 1,000 research jobs, then the ceilings, first one first. */
export function capacitySection(capacity: CapacitySummary): string[] {
  const { perJob, costs, jobDocument } = capacity;
  const per1000 = (value: number): string => fmt(value * 1000);
  const operations = table(
    ['Per 1,000 research jobs (Phaseline)', 'Document reads', 'Writes', 'Deletes', ...costs.map((cost) => `Cost, ${cost.location}`)],
    [
      ['Fault-free', per1000(perJob.faultFree.reads), per1000(perJob.faultFree.writes), per1000(perJob.faultFree.deletes), ...costs.map((cost) => usd(cost.faultFree))],
      [
        'Under the fault schedule (its sweeps included)',
        per1000(perJob.faulted.reads),
        per1000(perJob.faulted.writes),
        per1000(perJob.faulted.deletes),
        ...costs.map((cost) => usd(cost.faulted)),
      ],
    ],
  );
  const prices = costs.map((cost) => `${cost.location}: reads $${cost.prices.read}, writes $${cost.prices.write}, deletes $${cost.prices.delete} per 100,000`).join('; ');
  const [first] = capacity.ceilings;
  const firstMeasured = capacity.ceilings.find((ceiling) => ceiling.measured);
  const ceilings = table(
    ['Ceiling (first one first)', 'Research jobs per second', 'How'],
    capacity.ceilings.map((ceiling, index) => [index === 0 ? `**${ceiling.name}**` : ceiling.name, index === 0 ? `**${fmt(ceiling.jobsPerSecond, 2)}**` : fmt(ceiling.jobsPerSecond, 2), ceiling.how]),
  );
  const shared = Object.entries(capacity.sharedWritesPerJob);
  const headroom = jobDocument.limitPerSecond / jobDocument.sustainedWritesPerJobSecond;
  return [
    `Phaseline's figures per research job from section 1 (2 experts × 3 sections, 11 agent sections; medians of repeats), at ${capacity.modelLatencyMs} ms per model call. ` +
      'Reads are billed reads (documents delivered, missing documents, one per empty query); writes and deletes are those of commits that succeeded.',
    '',
    operations,
    '',
    `Prices (USD): ${prices}. Source: ${capacity.pricesSource}. Storage, index-entry reads, network, the free quota, Cloud Tasks and Cloud Functions are not in these costs.`,
    '',
    ceilings,
    '',
    `Tasks per research job: ${fmt(capacity.tasksPerJob.faultFree, 1)} fault-free, ${fmt(capacity.tasksPerJob.faulted, 1)} under the fault schedule (redeliveries count: each is a dispatch). ` +
      `The step queue's limits are \`runJobStep\`'s own settings; ${fmt(capacity.queue.maxDispatchesPerQueue)} dispatches/s is Cloud Tasks' maximum for one queue. ` +
      `Function-seconds are the tasks' run time added up (parallel tasks each count), ${fmt(capacity.functionSecondsPerJob, 2)} s per job as measured; ` +
      `the ${fmt(REAL_CALL_MS / 1000)} s row is worked out from it, not measured.`,
    '',
    `**One job document.** ${fmt(jobDocument.writesPerJob, 1)} writes per fault-free job (${fmt(jobDocument.writesPerSecondAtBenchSpeed, 1)}/s over its ${capacity.modelLatencyMs} ms-per-call wall time, in bursts: at this speed the steps follow one another at once). ` +
      `While a step runs with sections finishing faster than one a second, the job document takes ${fmt(jobDocument.sustainedWritesPerJobSecond, 2)} writes/s sustained (section 3), against about ${fmt(jobDocument.limitPerSecond)}/s per document: ` +
      `one job document carries ${fmt(headroom, 1)} such job at a time, which is the one it belongs to. Every job has its own document, so job documents do not cap jobs per second; they cap how often one job can report progress.`,
    '',
    shared.length === 0
      ? '**Shared documents.** A fault-free job writes no document outside its own (the provider circuit is written only on outages and recoveries), so no single document caps jobs per second.'
      : `**Shared documents.** Writes per fault-free job outside the job: ${shared.map(([kind, count]) => `${kind} ${fmt(count, 1)}`).join(', ')}; each such document carries about ${fmt(1)} write/s in all.`,
    '',
    first
      ? `**First ceiling: ${first.name}, ${fmt(first.jobsPerSecond, 2)} research jobs per second.**` +
        (firstMeasured && firstMeasured !== first ? ` At the bench's own ${capacity.modelLatencyMs} ms per model call it would be ${firstMeasured.name}, ${fmt(firstMeasured.jobsPerSecond, 2)} jobs per second; real model calls make tasks long, so the concurrent-dispatch limit comes first.` : '')
      : '',
    '',
  ];
}

/** The Targets table: each target, this run's figure, met or not (worked out from the figure), and where the figure is explained. */
export function targetsTable(targets: readonly TargetCheck[], links = true): string {
  return table(
    ['Target', 'Measured', 'Met?', 'From'],
    targets.map((check) => [
      check.target,
      check.measured,
      check.met === null ? 'n/a' : check.met ? 'yes' : '**no**',
      links ? `[${SECTION[check.section]}](#${anchor(SECTION[check.section])})` : SECTION[check.section],
    ]),
  );
}

export function renderMarkdown(results: BenchResults): string {
  const { meta } = results;
  const out: string[] = [];
  out.push('# Phaseline benchmarks', '');
  out.push(
    `Generated by \`npm run bench${meta.mode === 'smoke' ? ':smoke' : ''}\` on ${meta.finishedAt.slice(0, 10)}: ${meta.machine.cpus} CPUs, ` +
      `${fmt(meta.machine.memoryGiB)} GiB, Node ${meta.machine.node}, ${meta.firestore}. The whole run took ${fmt(meta.durationMs / 60_000, 1)} minutes` +
      (meta.machine.loadAverage
        ? `, on a shared machine whose 1-minute load average was ${fmt(meta.machine.loadAverage.mean, 1)} on average and up to ${fmt(meta.machine.loadAverage.max, 1)} (sampled every 10 s): wall times move with it; counts and virtual waits do not. `
        : '. ') +
      'Raw figures: `results.json`; chart: `results.svg`.',
    '',
  );
  if (Object.keys(meta.errors).length > 0) {
    out.push('**Scenarios that failed in this run:**', '', ...Object.entries(meta.errors).map(([name, error]) => `- ${name}: ${error}`), '');
  }

  out.push('## Targets', '');
  out.push(
    "The engine's targets against this run's figures. \"Met?\" is worked out from the figure, not written down; n/a means the figure was not measured in this run, " +
      'or was measured under other conditions than the target names (the measured column says which). Each figure is explained in the section it comes from.',
    '',
    targetsTable(results.targets),
    '',
  );

  if (results.comparison) {
    out.push(`## ${SECTION.comparison}`, '');
    out.push(
      `The same research jobs (${meta.inputs.length} input${meta.inputs.length === 1 ? '' : 's'}: 2 experts × 3 sections, 11 agent sections each), offline provider seed ${meta.providerSeed}, ` +
        `**${meta.modelLatencyMs} ms of real latency per model call**, the same section policy, the same fault schedule. ` +
        `Figures are per job: the median over ${meta.repeats} repeats of the mean over the inputs. A model call is "repeated" when the exact same request ` +
        '(every message) had already been sent in that job; a tool call when the same call ID had already run. The fault-free runs repeat nothing. ' +
        '(The skipped section changes what comes after it, so "with faults" minus "fault-free" is not the same figure; both are in results.json.)',
      '',
      'Faults, injected into every job at the same logical points (section and model-call number within it):',
      '',
      ...meta.faultSchedule.map((fault) => `- ${fault}`),
      '',
      comparisonTable(results.comparison.summary),
      '',
    );
    if (results.sensitivity) {
      const rows = ordered(results.sensitivity.summary).map((item) => [
        LABELS[item.implementation],
        `${fmt(item.wallMsFaultFree)} ms`,
        `${fmt(item.wallMsFaulted)} ms`,
        fmt(item.repeatedModelCalls, 1),
        fmt(item.publishedFaulted, 1),
      ]);
      out.push(
        `### Wall time when a model call takes ${results.sensitivity.latencyMs} ms`,
        '',
        `The same comparison at ${results.sensitivity.latencyMs} ms per call (fewer jobs: ${new Set(results.sensitivity.samples.map((sample) => sample.input)).size} input, ` +
          `${new Set(results.sensitivity.samples.map((sample) => sample.repeat)).size} repeats), to show which way wall time moves as calls get slower; real calls take seconds.`,
        '',
        table(['Implementation', 'Fault-free', 'With faults', 'Model calls repeated', 'Published with faults'], rows),
        '',
      );
    }
  }

  const overheads = [results.overhead, results.slowOverhead?.summary ?? null].filter((summary): summary is NonNullable<typeof summary> => summary !== null);
  if (overheads.length > 0) {
    const runs = (summary: (typeof overheads)[number]): string => {
      const samples = summary === results.overhead ? (results.comparison?.samples ?? []) : (results.slowOverhead?.samples ?? []);
      const inputs = new Set(samples.map((sample) => sample.input)).size;
      const repeats = new Set(samples.map((sample) => sample.repeat)).size;
      return `${inputs} input${inputs === 1 ? '' : 's'}, ${repeats} repeat${repeats === 1 ? '' : 's'}`;
    };
    const ratio = (summary: (typeof overheads)[number]): string =>
      `**×${fmt(summary.wallTimeRatio, 2)}, ${addedPercent(summary.wallTimeRatio)}** (per repeat: ${summary.ratios.map((value) => fmt(value, 3)).join(', ')})`;
    const row = (label: string, cell: (summary: (typeof overheads)[number]) => string): string[] => [label, ...overheads.map(cell)];
    const slow = results.slowOverhead?.summary ?? null;
    const phaseline = results.comparison ? find(results.comparison.summary, 'phaseline') : undefined;
    const callsPerSection = results.overhead && phaseline ? phaseline.modelCallsFaultFree / results.overhead.sectionsPerJob : Number.NaN;
    out.push(`## ${SECTION.overhead}`, '');
    out.push(
      'Fault-free, the same phases: in-process with no durability (no Firestore at all, so no operations) against Phaseline on the emulator, at the same model latency. ' +
        [
          ...(results.overhead ? [`At ${fmt(meta.modelLatencyMs)} ms per model call these are the comparison's own fault-free runs (section 1)`] : []),
          ...(slow ? [`${results.overhead ? 'at' : 'At'} ${fmt(slow.latencyMs)} ms per model call the two run alone, on fewer jobs (no baselines, no faults)`] : []),
        ].join('; ') +
        '. The ratio is the median over repeats of the ratio within each repeat.' +
        (results.overhead
          ? ` The targets on operations per agent section are read from the ${fmt(meta.modelLatencyMs)} ms column (a slower model lets a step live long enough to heartbeat, which can add writes).`
          : ''),
      '',
      table(
        ['Per job', ...overheads.map((summary) => `${fmt(summary.latencyMs)} ms per model call (${runs(summary)})`)],
        [
          row('Wall time in-process, no durability', (summary) => `${fmt(summary.inMemoryWallMs)} ms`),
          row('Wall time, Phaseline on the emulator', (summary) => `${fmt(summary.phaselineWallMs)} ms`),
          row('**Phaseline against in-process**', ratio),
          row('Added time per agent section', (summary) => `${fmt(summary.addedMsPerSection)} ms (over ${fmt(summary.sectionsPerJob)} sections)`),
          row('Firestore reads per agent section (billed)', (summary) => fmt(summary.readsPerSection, 1)),
          row('… of which, by document', (summary) => byDocument(summary.readsPerSectionByDocument)),
          row('Firestore writes per agent section (durable: drafts left out)', (summary) => fmt(summary.writesPerSection, 1)),
          row('Draft writes per agent section (the text in flight, streamed, at most one a second per section)', (summary) => fmt(summary.draftWritesPerSection, 1)),
          row('… of which, by document', (summary) => byDocument(summary.writesPerSectionByDocument)),
          row('Transactions per agent section', (summary) => `${fmt(summary.transactionsPerSection, 1)} (${fmt(summary.transactionAttemptsPerSection, 1)} attempts)`),
          row('Commits per agent section (that wrote something: durable writes)', (summary) => fmt(summary.commitsPerSection, 1)),
          row('Round trips per agent section: for durable writes / in all', (summary) => `${fmt(summary.writeRoundTripsPerSection, 1)} / ${fmt(summary.roundTripsPerSection, 1)}`),
          row('**Round trips per durable write** (1 when every durable write is a single round trip)', (summary) => `**${fmt(summary.roundTripsPerDurableWrite, 2)}**`),
          row(
            'Transcript bytes written per agent section: append-only log / whole transcript rewritten at each save',
            (summary) => `${fmt(summary.transcriptBytesPerSection.appendOnly)} / ${fmt(summary.transcriptBytesPerSection.wholeRewrite)}`,
          ),
        ],
      ),
      '',
      'A round trip is one RPC to Firestore (a get, a query, a commit, a rollback). Those for durable writes are every commit RPC (failed ones too) and the reads and rollbacks of transactions: ' +
        'a plain commit, or a transaction that reads nothing, is one; a transaction that reads before it writes is at least two per attempt. ' +
        'Transcript bytes are the JSON size of the transcript documents the job wrote (each save of the append-only log holds only what it appended), against the JSON size of the whole transcript as it stood after each of the same saves (one document per section rewritten on every save, the scheme before the log): an estimate of stored bytes, the same for both.',
      '',
      slow
        ? `At ${fmt(slow.latencyMs)} ms a model call the bookkeeping is measured, not extrapolated: ${fmt(slow.addedMsPerSection)} ms per agent section, ` +
            `${addedPercent(slow.wallTimeRatio)} on the job's wall time (the emulator on 2 shared cores is slower than production Firestore, and so few repeats of a job this long are noisy).`
        : results.overhead
          ? `An agent section here makes about ${fmt(callsPerSection, 1)} model calls; ` +
            `with real calls of 1–10 s each, ${fmt(results.overhead.addedMsPerSection)} ms of bookkeeping per section is a few percent at most (an extrapolation, not a measurement; ` +
            'the emulator on 2 shared cores is also slower than production Firestore).'
          : '',
      '',
    );
  }

  if (results.writeRate) {
    out.push(`## ${SECTION.writeRate}`, '');
    out.push(
      'One step of a bench pipeline records sections at a fixed pace and reports progress after each, with the real flusher on real timers and the system clock ' +
        '(minimum gap 1 s between progress writes). Every write to the job document in the step is counted, the claim and the hand-off included.',
      '',
      table(
        [
          'Pace asked',
          'Sections',
          'Sections/s (measured)',
          'Step length',
          'Job-document writes (claim + progress + hand-off)',
          'Progress writes/s, sustained',
          'Shortest gap between progress writes',
          'Most writes in any 1 s',
          'Without coalescing',
        ],
        results.writeRate.summary.map((rate) => [
          `one every ${rate.intervalMs} ms`,
          fmt(rate.sections),
          fmt(rate.sectionsPerSecond, 1),
          `${fmt(rate.phaseMs / 1000, 1)} s`,
          `${fmt(rate.jobWrites)} (1 + ${fmt(rate.progressWrites)} + 1)`,
          Number.isFinite(rate.progressWritesPerSecond) ? fmt(rate.progressWritesPerSecond, 2) : 'n/a (one progress write)',
          Number.isFinite(rate.minProgressGapMs) ? `${fmt(rate.minProgressGapMs)} ms` : 'n/a',
          fmt(rate.maxJobWritesInOneSecond),
          `${fmt(rate.uncoalescedJobWrites)} writes`,
        ]),
      ),
      '',
      '"Sustained" is the progress writes after the first, per second between the first and the last of them. The first progress write goes out as soon as there is ' +
        'progress (the flusher has not written yet), so it can share a second with the claim; the hand-off can share one with the last progress write.',
      '',
    );
  }

  if (results.sweeper) {
    out.push(`## ${SECTION.sweeper}`, '');
    out.push(
      `Jobs seeded with batched writes (5 % running with live leases, 5 % queued, 2 % waiting for a person, the rest completed), of which ${results.sweeper.summary[0]?.expired ?? '?'} have expired leases. ` +
        `Each sweep reclaims them (they are put back before the next), ${results.sweeper.samples.length / Math.max(1, results.sweeper.summary.length)} sweeps per size. ` +
        '"Documents read" is the sweeper\'s own count (query results plus documents read in its transactions); ' +
        '"billed" adds one read per empty query. The time is the emulator\'s, which scans instead of using indexes.',
      '',
      table(
        ['Jobs', 'Expired', 'Documents read', 'Billed reads', 'Writes', 'Time per sweep (median)', 'Without the range index'],
        results.sweeper.summary.map((row) => [
          fmt(row.totalJobs),
          fmt(row.expired),
          fmt(row.documentsRead),
          fmt(row.billedReads),
          fmt(row.writes),
          `${fmt(row.msPerSweep)} ms`,
          `${fmt(row.equalityOnlyReads)} reads`,
        ]),
      ),
      '',
      '"Without the range index" is what the expired-lease query would read if it could filter only on `status == running` and checked the expiry in code.',
      '',
    );
  }

  if (results.contention) {
    out.push(`## ${SECTION.contention}`, '');
    out.push(
      'Concurrent deliveries of step 0: claimer *i* runs the real runner on job *i* mod *J* (a one-phase pipeline: the winner claims, runs an empty phase and hands off). ' +
        '"Retried attempts" are transaction attempts beyond one claim per claimer and one hand-off per winner (contention aborts, retried by the SDK or the store).',
      '',
      table(
        ['Claimers', 'Jobs', 'Winners (expected)', 'Most winners on one job', 'Retried attempts', 'Aborted RPCs', 'Errors', 'Time to settle (median)'],
        results.contention.summary.map((row) => [
          fmt(row.claimers),
          fmt(row.jobs),
          `${fmt(row.winners)} (${fmt(row.expectedWinners)})`,
          fmt(row.maxWinnersPerJob),
          fmt(row.retriedAttempts),
          fmt(row.abortedRpcs),
          fmt(row.errors),
          `${fmt(row.settleMs)} ms`,
        ]),
      ),
      '',
    );
  }

  if (results.throughput) {
    out.push(`## ${SECTION.throughput}`, '');
    const plan = results.throughput.raw.plan;
    if (results.throughput.raw.skipped) {
      out.push(`Not measured in this run: ${results.throughput.raw.skipped}.`, '');
    } else {
      out.push(
        `\`${plan.pipeline}\` jobs submitted over HTTP to \`submitJob\` (Auth emulator token), every step a Cloud Task through the tasks emulator into \`runJobStep\` ` +
          `on the functions emulator, Firestore from the project's launcher; a fixed number of jobs in flight, after ${plan.warmupJobs} warm-up job(s). ` +
          '"Queued" is from the job document\'s `createdAt` to its first `claimed` event. The functions emulator starts a worker process per concurrent invocation on these 2 cores, ' +
          'so this measures the local stack, not production capacity.',
        '',
        table(
          ['Jobs in flight', 'Jobs', 'Completed', 'Jobs per minute', 'Queued, median', 'Queued, max', 'End to end, median'],
          results.throughput.summary.map((row) => [
            fmt(row.concurrency),
            fmt(row.jobs),
            fmt(row.completed),
            fmt(row.jobsPerMinute, 1),
            `${fmt(row.queuedMsMedian)} ms`,
            `${fmt(row.queuedMsMax)} ms`,
            `${fmt(row.endToEndMsMedian)} ms`,
          ]),
        ),
        '',
      );
    }
  }

  if (results.capacity) {
    out.push(`## ${SECTION.capacity}`, '');
    out.push(...capacitySection(results.capacity));
  }

  out.push('## Where Phaseline is not ahead', '');
  out.push(...(results.notAhead.length > 0 ? results.notAhead.map((note) => `- ${note}`) : ['- Nowhere in this run.']), '');

  out.push('## How this was measured', '');
  out.push(
    ...[
      `**Latency is real.** Every model call (injected errors included) waits ${meta.modelLatencyMs} ms on a real timer through the offline provider's \`latencyMs\` and \`sleep\`; tool calls (the bundled corpus) add none. ` +
        'Nothing that production would spend waiting is slept: Phaseline runs on an injected clock that jumps to the next task due (a backoff ending, a redelivery) or to the first every-minute sweep after a lease expired, whichever comes first; ' +
        `the baselines' redelivery waits are computed from the same rules. Both follow the step queue as \`runJobStep\` configures it (read from its settings: backoff from ${STEP_QUEUE.minBackoffSeconds} s, doubling ${STEP_QUEUE.maxDoublings} times, at most ${STEP_QUEUE.maxBackoffSeconds} s, ${STEP_QUEUE.maxAttempts} deliveries; function timeout ${STEP_QUEUE.timeoutSeconds} s). ` +
        'A failed delivery is retried on that schedule: a killed worker\'s request fails at once, a frozen worker\'s only at the function timeout, and a Phaseline task whose claim is not yet due waits in its request for up to the take-over age in all and tries again (runStepWhenDue), and fails on purpose only past that (the trigger throws to be redelivered). ' +
        'Those jumps are the "recovery wait (virtual)"; the wait per lost worker runs from the loss to the reclaim in the job\'s timeline (a redelivered task\'s takeover or the sweeper\'s), or for the baselines to the redelivery.',
      '**Phaseline** is the real runner and sweeper on the official Firestore emulator, driven in-process as `test/support/engine.ts` drives them: a task-queue port that drops duplicate task IDs, ' +
        `due tasks run concurrently (up to 4, so the two experts run in parallel), the engine's default options (lease ${fmt(meta.engineOptions.leaseSeconds ?? Number.NaN)} s, heartbeat ${fmt(meta.engineOptions.heartbeatSeconds ?? Number.NaN)} s, ` +
        `takeover after ${fmt(meta.engineOptions.staleHeartbeatSeconds ?? Number.NaN)} s without one, progress flush ${fmt((meta.engineOptions.progressFlushMs ?? Number.NaN) / 1000)} s). Workers run with real timers that stop when a fault takes the worker. ` +
        'The injected clock stands still while tasks run, so a worker is killed right after its last heartbeat: the longest a redelivery has to wait for it to go stale. ' +
        '"Task lost, sweeper only" runs the same faulted jobs with the killed worker\'s task never delivered again, so only the sweeper recovers it (the way every crash was recovered before redelivered tasks could take over).',
      '**Retry the whole job** and **phase checkpoints only** are written in the bench (bench/lib/baselines.ts). They run the research pipeline\'s own phases and section runner (same in-call retries, same skip rule), ' +
        'the experts in parallel, inside one task. Any failure fails the task; the redelivery starts from the outline, or from the first phase without a checkpoint in Firestore. ' +
        'Sections and transcripts live in memory. A redelivery of a completed job is skipped (checked when the attempt starts); the answer is appended to the job\'s results, as a chat answer is posted.',
      '**Faults** are keyed by section and call number, counted over the whole job (restarts included), so each one-shot fault fires once, at the same logical point, whatever the interleaving. ' +
        'A crash leaves the worker\'s call unanswered forever (for the baselines it also aborts the attempt, as a killed process stops every branch). A frozen worker is woken after its replacement finished; what it then does is the "on waking" row.',
      '**Firestore reads and writes** are counted on the wire of the implementation\'s own client: the bench wraps that one client instance\'s internal `request`/`requestStream` RPC methods and `runTransaction` ' +
        '(bench/lib/counting.ts). Reads are documents delivered by gets and queries, missing documents, and one per empty query (as billed); writes are the writes of commits that succeeded. ' +
        'Every RPC is counted as a round trip; those of durable writes are the commit RPCs and the reads and rollbacks of transactions (a read carries the transaction it starts or belongs to). ' +
        'The bench\'s own bookkeeping (status checks, counting results, seeding) goes through a second, uncounted client. Submission is included; the sweeps Phaseline needed to recover are included.',
      '**Published results** are the documents under `jobs/{id}/results` once every worker, frozen ones included, has stopped.',
      `**Timing** is noisy on a shared 2-core machine: figures are medians over ${meta.repeats} repeats, ratios are taken within a repeat, and the implementations' order rotates between repeats. ` +
        'The emulators are warmed up before anything is measured. The bench\'s own process (every scenario but the end-to-end one) runs under tsx with source maps off, as a deployed function runs ' +
        '(the Firestore SDK captures a stack trace on every request, and mapping each one through tsx\'s source maps would add tens of milliseconds per job that production does not spend).',
    ].map((line) => `- ${line}`),
    '',
  );
  return out.join('\n');
}
