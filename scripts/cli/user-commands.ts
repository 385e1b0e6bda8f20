/**
 * What a user does: submit, watch, list, cancel, decide. Writes go through the HTTP functions with
 * the user's ID token; reads through the Firestore REST API under the security rules, exactly
 * what the chat page can see.
 */
import { readFile } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { TERMINAL_STATUSES } from '../../functions/src/core/job';
import { jobPath, JOBS } from '../../functions/src/store/paths';
import { parseJsonInput, type Command } from './args';
import { CliError, EXIT } from './errors';
import { byTime, finalLines, jobTable, reportLines, statusLine, terminalText, timelineLine, type TimeOptions } from './format';
import { functionsClient, type FunctionsClient } from './functions-client';
import { identitySource, type IdentitySource } from './identity';
import type { Io } from './io';
import { userFirestore, type UserFirestore } from './firestore-rest';
import { describeTarget, type Target } from './target';
import { eventViewFromData, jobViewFromData, resultPathOf, type EventView, type JobView } from './views';
import { readSection } from '../../client';
import { liveReport, REPORT_PHASE, type LiveReport } from '../../web/src/research-view';

export interface UserContext {
  readonly target: Target;
  readonly io: Io;
  readonly identity: IdentitySource;
  readonly firestore: UserFirestore;
  readonly functions: FunctionsClient;
  /** Waits between two reads of a watched job. */
  readonly pause: () => Promise<void>;
  readonly time: TimeOptions;
  /** Reads a file, or standard input for "-". */
  readonly readInput: (path: string) => Promise<string>;
}

export const WATCH_INTERVAL_MS = 1_000;
/**
 * Event times come from the clocks of whichever workers wrote them, so each read also looks this
 * far back; events already shown are recognised by their ID.
 */
export const EVENT_CLOCK_SKEW_MS = 60_000;

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(String(chunk)));
  return Buffer.concat(chunks).toString('utf8');
}

export function userContext(target: Target, io: Io, env: NodeJS.ProcessEnv): UserContext {
  const identity = identitySource(target, { env });
  const firestore = userFirestore({
    baseUrl: target.firestoreUrl,
    projectId: target.projectId,
    idToken: async () => (await identity()).idToken,
    describe: target.kind === 'local' ? `the Firestore emulator at ${target.hosts.firestore}` : `Firestore of ${target.projectId}`,
    unreachableHint: target.kind === 'local' ? 'Is the local stack running? Start it with `npm start`.' : 'Check the network and the project ID.',
  });
  return {
    target,
    io,
    identity,
    firestore,
    functions: functionsClient(target, identity),
    pause: () => sleep(WATCH_INTERVAL_MS),
    time: {},
    readInput: async (path) => {
      try {
        return path === '-' ? await readStdin() : await readFile(path, 'utf8');
      } catch (error) {
        throw new CliError(`Could not read the input from ${path === '-' ? 'standard input' : path}: ${error instanceof Error ? error.message : String(error)}`);
      }
    },
  };
}

type SubmitCommand = Extract<Command, { name: 'submit' }>;
type WatchCommand = Extract<Command, { name: 'watch' }>;
type ListCommand = Extract<Command, { name: 'list' }>;
type CancelCommand = Extract<Command, { name: 'cancel' }>;
type DecideCommand = Extract<Command, { name: 'decide' }>;

function record(body: unknown): Record<string, unknown> {
  return typeof body === 'object' && body !== null ? (body as Record<string, unknown>) : {};
}

const text = (value: unknown, fallback: string): string => (typeof value === 'string' ? value : fallback);

/** Submits through submitJob; the task ID alone goes to stdout, so `id=$(phaseline submit ...)` works. */
export async function submit(ctx: UserContext, command: SubmitCommand): Promise<number> {
  const input = command.source.kind === 'json' ? command.source.input : parseJsonInput(await ctx.readInput(command.source.path), `in ${command.source.path}`);
  const answer = await ctx.functions.call(
    'submitJob',
    { pipeline: command.pipeline, input, ...(command.conversationId === undefined ? {} : { conversationId: command.conversationId }) },
    command.idempotencyKey === undefined ? {} : { 'idempotency-key': command.idempotencyKey },
  );
  const body = record(answer.body);
  if (typeof body.taskId !== 'string') throw new CliError(`submitJob answered ${answer.status} without a task ID: ${JSON.stringify(answer.body).slice(0, 300)}`);
  const replayed = answer.headers.get('idempotent-replayed') === 'true';
  ctx.io.err(
    `${replayed ? 'Already submitted with this Idempotency-Key:' : 'Submitted'} ${command.pipeline} job ${body.taskId} (${text(body.status, 'queued')}). ` +
      (command.watch ? 'Watching it:' : `Watch it with: phaseline watch ${body.taskId}`),
  );
  ctx.io.out(body.taskId);
  return command.watch ? watch(ctx, { name: 'watch', jobId: body.taskId, report: false }) : EXIT.ok;
}

async function readJob(ctx: UserContext, jobId: string): Promise<JobView> {
  const document = await ctx.firestore.get(jobPath(jobId));
  if (document === null) {
    const { uid } = await ctx.identity();
    throw new CliError(`No job ${jobId} that you can read: it does not exist on ${describeTarget(ctx.target)}, or it belongs to another user (you are ${uid}).`);
  }
  return jobViewFromData(document.id, document.data);
}

async function readEvents(ctx: UserContext, jobId: string, sinceMs: number): Promise<EventView[]> {
  const documents = await ctx.firestore.query(jobPath(jobId), {
    collection: 'events',
    where: [{ field: 'atMs', op: 'GREATER_THAN_OR_EQUAL', value: Math.max(0, sinceMs - EVENT_CLOCK_SKEW_MS) }],
    orderBy: [{ field: 'atMs', direction: 'ASCENDING' }],
  });
  return documents.map((document) => eventViewFromData(document.id, document.data)).sort(byTime);
}

/** The report sections recorded so far (research's final-document phase), in report order, as the chat page shows them. */
async function readReportSections(ctx: UserContext, jobId: string): Promise<LiveReport['finished']> {
  const documents = await ctx.firestore.query(jobPath(jobId), { collection: 'sections', where: [{ field: 'phase', op: 'EQUAL', value: REPORT_PHASE }] });
  return liveReport({ status: 'running', phase: REPORT_PHASE, epoch: 0 }, documents.map((document) => readSection(document.data)), []).finished;
}

/**
 * Whether `watch` stops here: the job ended, or it waits for a person. A provider wait ends by
 * itself within minutes, so watching goes on; a wait at the daily spend limit lasts until the day
 * ends unless its owner resumes or cancels it, so watching stops with what they can do.
 */
export function watchEndsAt(job: Pick<JobView, 'status' | 'waiting'>): boolean {
  return TERMINAL_STATUSES.has(job.status) || (job.status === 'waiting' && (job.waiting?.reason === 'decision' || job.waiting?.reason === 'budget'));
}

/**
 * Reads the job and its new events every second, printing each event once (in time order) and
 * redrawing the progress line, until the job completes, fails, is cancelled or quarantined, or
 * waits for a decision. The job is read before its events: the event of a status change is
 * written in the same transaction, so the last read always includes it.
 */
export async function watch(ctx: UserContext, command: WatchCommand): Promise<number> {
  const shown = new Set<string>();
  /** With --report: the report sections already printed as they were recorded. */
  const sectionsShown = new Set<string>();
  let sinceMs = 0;
  for (;;) {
    const job = await readJob(ctx, command.jobId);
    for (const event of await readEvents(ctx, command.jobId, sinceMs)) {
      if (shown.has(event.id)) continue;
      shown.add(event.id);
      sinceMs = Math.max(sinceMs, event.atMs);
      ctx.io.out(timelineLine(event, ctx.time));
    }
    if (command.report && job.status !== 'completed') {
      for (const section of await readReportSections(ctx, command.jobId)) {
        if (sectionsShown.has(section.key)) continue;
        sectionsShown.add(section.key);
        // Model-written text, shown as it is recorded: the same terminal-safe rendering as the report.
        for (const line of reportLines(`\n## ${section.heading}\n\n${section.text}\n`)) ctx.io.out(line);
      }
    }
    ctx.io.status(statusLine(job, ctx.time));
    if (watchEndsAt(job)) {
      ctx.io.endStatus();
      const resultPath = resultPathOf(job);
      for (const line of finalLines(job, resultPath, ctx.time)) ctx.io.out(line);
      if (command.report && job.status === 'completed') await printReport(ctx, resultPath);
      return job.status === 'completed' || job.status === 'waiting' ? EXIT.ok : EXIT.failure;
    }
    await ctx.pause();
  }
}

async function printReport(ctx: UserContext, path: string): Promise<void> {
  const document = await ctx.firestore.get(path);
  const markdown = document?.data.markdown;
  if (typeof markdown !== 'string') throw new CliError(`The report at ${path} cannot be read.`);
  ctx.io.out('');
  // Model-written text: links shown only when http(s), control characters made visible.
  for (const line of reportLines(markdown)) ctx.io.out(line);
}

/** The user's own jobs, newest first. (In production this query needs the jobs (owner, createdAt desc) index.) */
export async function listOwn(ctx: UserContext, command: ListCommand): Promise<number> {
  const { uid } = await ctx.identity();
  const documents = await ctx.firestore.query('', {
    collection: JOBS,
    where: [{ field: 'owner', op: 'EQUAL', value: uid }],
    orderBy: [{ field: 'createdAt', direction: 'DESCENDING' }],
    limit: command.limit,
  });
  ctx.io.err(`Jobs of ${terminalText(uid)} on ${describeTarget(ctx.target)}, newest first:`);
  const jobs: JobView[] = [];
  for (const document of documents) {
    // One job this CLI cannot read is named and left out; the others are still listed.
    try {
      jobs.push(jobViewFromData(document.id, document.data));
    } catch (error) {
      ctx.io.err(terminalText(`Skipped job ${document.id}: ${error instanceof Error ? error.message : String(error)}`));
    }
  }
  for (const line of jobTable(jobs, ctx.time)) ctx.io.out(line);
  return EXIT.ok;
}

export async function cancel(ctx: UserContext, command: CancelCommand): Promise<number> {
  const answer = await ctx.functions.call('cancelJob', { jobId: command.jobId, ...(command.reason === undefined ? {} : { reason: command.reason }) });
  const body = record(answer.body);
  ctx.io.out(`Job ${command.jobId} is ${text(body.status, 'cancelled')}.`);
  if (typeof body.report === 'string') ctx.io.out(terminalText(body.report));
  const unknown = typeof body.unknownEffects === 'number' ? body.unknownEffects : 0;
  if (unknown > 0) ctx.io.out(`${unknown} effect${unknown === 1 ? ' was' : 's were'} in flight: their outcome is unknown until checked against the system of record.`);
  return EXIT.ok;
}

export async function decide(ctx: UserContext, command: DecideCommand): Promise<number> {
  const answer = await ctx.functions.call('decideJob', { jobId: command.jobId, questionId: command.questionId, answer: command.answer });
  const body = record(answer.body);
  ctx.io.out(`Answered ${command.questionId}: "${command.answer}". Job ${command.jobId} is ${text(body.status, 'queued')} again; watch it with: phaseline watch ${command.jobId}`);
  return EXIT.ok;
}
