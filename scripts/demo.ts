/**
 * `npm run demo`: the local stack, headless and one-shot. Signs in anonymously on the Auth
 * emulator, submits a research job over HTTP, shows its progress from the job document (as a user
 * reads it, under the security rules), prints where the report is and a short summary, stops the
 * stack and exits: 0 when the job completed, 1 with the reason when it did not.
 *
 *   npm run demo                     offline provider, no keys
 *   npm run demo -- "Your question"  another question
 *   npm run demo -- --web            the same job on web tools: search and fetch_page against a
 *                                    local SearXNG-shaped server over pages in scripts/web-fixtures/;
 *                                    prints the report's references
 *
 * PHASELINE_DEMO_TIMEOUT_SECONDS (default 300) bounds the wait; PHASELINE_OFFLINE_SETTINGS, when
 * set, replaces the demo's simulated provider settings.
 */
import { randomUUID } from 'node:crypto';
import { deleteApp, initializeApp } from 'firebase/app';
import { connectAuthEmulator, getAuth, signInAnonymously } from 'firebase/auth';
import { collection, connectFirestoreEmulator, doc, getDoc, getFirestore, onSnapshot, orderBy, query, terminate } from 'firebase/firestore';
import { formatCost, outboxPath, readEvent, readJob, readResult, readUnit, TERMINAL_STATUSES, type EventView, type JobView, type UnitView } from '../client';
import { summarizeProgress, textBar } from '../web/src/research-view';
import { DEMO_USAGE, DemoUsageError, parseDemoArguments } from './lib/demo-args';
import { startLocalStack, stopOnSignals, type WebConfig } from './lib/local-stack';
import { startResearchWeb, type ResearchWeb } from './lib/research-web';

const DEFAULT_QUESTION = 'How do durable job pipelines keep long-running AI agent work from being lost or done twice?';
/**
 * Simulated: a little latency per model call so progress is visible, and small-model prices
 * (per 1,000 tokens) so the cost line has something to show. No money is spent.
 */
const DEMO_OFFLINE_SETTINGS = JSON.stringify({ latencyMs: 150, inputUsdPer1kTokens: 0.00015, outputUsdPer1kTokens: 0.0006 });

const tty = process.stdout.isTTY;
let barShown = false;
function clearBar(): void {
  if (tty && barShown) process.stdout.write('\r\x1b[2K');
  barShown = false;
}
function log(line: string): void {
  clearBar();
  console.log(line);
}

const elapsed = (startMs: number): string => `${((Date.now() - startMs) / 1000).toFixed(1)} s`;
const clock = (ms: number): string => new Date(ms).toISOString().slice(11, 19);

async function submit(config: WebConfig, idToken: string, question: string): Promise<string> {
  const key = randomUUID();
  const body = JSON.stringify({ pipeline: 'research', input: { question, experts: 3, sections: 3, wordsPerSection: 150 } });
  for (let attempt = 1; ; attempt += 1) {
    try {
      const response = await fetch(`${config.functionsBaseUrl}/submitJob`, {
        method: 'POST',
        // The same Idempotency-Key on every try: a retry finds the job the first try made.
        headers: { authorization: `Bearer ${idToken}`, 'content-type': 'application/json', 'idempotency-key': key },
        body,
      });
      const answer = (await response.json()) as { taskId?: string; message?: string };
      if (response.status === 202 && answer.taskId) return answer.taskId;
      if (response.status < 500 || attempt >= 3) throw new Error(`submitJob answered ${response.status}: ${answer.message ?? JSON.stringify(answer)}`);
    } catch (error) {
      if (attempt >= 3 || (error instanceof Error && error.message.startsWith('submitJob answered'))) throw error;
    }
    await new Promise((resolve) => setTimeout(resolve, 500 * attempt));
  }
}

function progressLine(job: JobView, units: readonly UnitView[]): string {
  const progress = summarizeProgress(job, units);
  const parts = [
    `${textBar(progress.fraction)} ${String(Math.round(progress.fraction * 100)).padStart(3)}%`,
    job.status === 'running' || job.status === 'queued' ? (job.phase ?? 'starting') : job.status,
    `expert sections ${progress.expertSections.done}/${progress.expertSections.total || '?'}`,
    ...(progress.units ? [`experts ${progress.units.done}/${progress.units.total}`] : []),
    `report sections ${progress.reportSections.done}/${progress.reportSections.total || '?'}`,
  ];
  return parts.join(' · ');
}

/** The functions' research tools set to the local server: its SearXNG API, and fetch_page allowed to reach it. */
function webToolsEnv(web: ResearchWeb): Record<string, string> {
  return { PHASELINE_SEARCH: 'searxng', PHASELINE_SEARXNG_URL: web.url, PHASELINE_FETCH_ALLOWED_ADDRESSES: new URL(web.url).host };
}

/** The report's reference definitions (`[n]: <url> "Title"`), the lines under its References heading. */
function referencesOf(markdown: string): string[] {
  const at = markdown.indexOf('\n## References\n');
  if (at < 0) return [];
  return markdown
    .slice(at + '\n## References\n'.length)
    .split('\n')
    .filter((line) => /^\[\d+\]: </.test(line));
}

interface Outcome {
  readonly job: JobView;
  readonly units: readonly UnitView[];
  readonly events: readonly EventView[];
}

async function main(): Promise<number> {
  const args = parseDemoArguments(process.argv.slice(2));
  if (args.help) {
    console.log(DEMO_USAGE);
    return 0;
  }
  const question = args.question ?? DEFAULT_QUESTION;
  const timeoutMs = (Number(process.env.PHASELINE_DEMO_TIMEOUT_SECONDS) || 300) * 1000;
  const startMs = Date.now();
  log(`Phaseline demo: the local stack, one research job, offline provider (no keys)${args.web ? ', web tools on a local SearXNG-shaped server' : ''}`);
  const web = args.web ? await startResearchWeb() : null;
  if (web) log(`  local web: search at ${web.url}/search, ${web.pageUrls.length} pages under ${web.url}/pages/`);
  const stack = startLocalStack({
    page: false,
    echoEmulatorOutput: 'problems',
    functionsEnv: { PHASELINE_OFFLINE_SETTINGS: process.env.PHASELINE_OFFLINE_SETTINGS ?? DEMO_OFFLINE_SETTINGS, ...(web ? webToolsEnv(web) : {}) },
    log: (line) => log(`  ${line}`),
  });
  // The local web server lives in this process: it stops after the stack, on every way out.
  const stopEverything = async (): Promise<void> => {
    await stack.stop();
    await web?.close();
  };
  const removeSignalHandlers = stopOnSignals(stopEverything, log);
  let app: ReturnType<typeof initializeApp> | null = null;
  let db: ReturnType<typeof getFirestore> | null = null;
  try {
    const running = await stack.ready;
    log(`  stack ready in ${elapsed(startMs)}`);
    const { config } = running;

    app = initializeApp({ projectId: config.projectId, apiKey: config.apiKey, authDomain: '127.0.0.1' }, 'phaseline-demo');
    const auth = getAuth(app);
    connectAuthEmulator(auth, config.authEmulatorUrl, { disableWarnings: true });
    const firestore = getFirestore(app);
    db = firestore;
    connectFirestoreEmulator(firestore, config.firestoreHost, config.firestorePort);
    const user = (await signInAnonymously(auth)).user;
    log(`\nSigned in anonymously as ${user.uid}`);
    log(`Question: ${question}`);

    const submittedMs = Date.now();
    const jobId = await submit(config, await user.getIdToken(), question);
    log(`Submitted: task ${jobId} (status at jobs/${jobId})\n`);

    const outcome = await new Promise<Outcome>((resolve, reject) => {
      let job: JobView | null = null;
      let units: UnitView[] = [];
      const events: EventView[] = [];
      const seen = new Set<string>();
      let lastLine = '';
      const draw = (): void => {
        if (!job) return;
        const line = progressLine(job, units);
        if (tty) {
          clearBar();
          process.stdout.write(line);
          barShown = true;
        } else if (line !== lastLine) {
          console.log(line);
        }
        lastLine = line;
      };
      const stops: (() => void)[] = [];
      const finish = (error: Error | null): void => {
        clearTimeout(timer);
        for (const stop of stops) stop();
        clearBar();
        if (error) reject(error);
        else if (job) resolve({ job, units, events });
      };
      const timer = setTimeout(() => finish(new Error(`the job did not finish within ${timeoutMs / 1000} s (last: ${lastLine || 'no progress seen'})`)), timeoutMs);
      void running.died.then((reason) => finish(new Error(`the emulators stopped: ${reason}`)));
      const failed = (error: Error): void => finish(new Error(`watching the job failed: ${error.message}`));
      stops.push(
        onSnapshot(
          query(collection(firestore, `jobs/${jobId}/events`), orderBy('atMs')),
          (snapshot) => {
            for (const change of snapshot.docChanges()) {
              if (change.type !== 'added' || seen.has(change.doc.id)) continue;
              seen.add(change.doc.id);
              const event = readEvent(change.doc.id, change.doc.data());
              events.push(event);
              log(`  ${clock(event.atMs)}  ${event.kind.padEnd(16)} ${event.unit ? `[${event.unit}] ` : ''}${event.message}`);
            }
            draw();
          },
          failed,
        ),
        onSnapshot(
          collection(firestore, `jobs/${jobId}/units`),
          (snapshot) => {
            units = snapshot.docs.map((unit) => readUnit(unit.id, unit.data()));
            draw();
          },
          failed,
        ),
        onSnapshot(
          doc(firestore, `jobs/${jobId}`),
          (snapshot) => {
            if (!snapshot.exists()) return;
            job = readJob(jobId, snapshot.data());
            draw();
            if (TERMINAL_STATUSES.has(job.status)) finish(null);
          },
          failed,
        ),
      );
    });

    const { job, units } = outcome;
    const progress = summarizeProgress(job, units);
    if (tty) log(progressLine(job, units)); // the bar line was cleared; elsewhere it is printed already
    log(`\nJob ${job.id}: ${job.status}${job.outcome ? ` (${job.outcome})` : ''} after ${elapsed(submittedMs)}`);
    const resultPath = outboxPath(job);
    const result = job.status === 'completed' ? readResult((await getDoc(doc(firestore, resultPath))).data()) : null;
    log(`  job document:      jobs/${job.id} (timeline: jobs/${job.id}/events)`);
    if (result) log(`  report:            ${resultPath}  "${result.title}" (${result.markdown.length} characters of Markdown)`);
    log(`  expert sections:   ${progress.expertSections.done} of ${progress.expertSections.total} written, ${progress.expertSections.skipped} skipped`);
    log(`  report sections:   ${progress.reportSections.done} of ${progress.reportSections.total}`);
    if (result && result.missing.length > 0) log(`  missing:           ${result.missing.join('; ')}`);
    log(`  cost:              ${formatCost(job.cost)}${process.env.PHASELINE_OFFLINE_SETTINGS ? '' : ' (offline provider: simulated prices)'}`);
    log(`  retries:           ${job.attempts} caught errors, ${job.staleReclaims} stale reclaims`);
    if (job.status !== 'completed') {
      const reason = job.lastError?.message ?? job.quarantine?.reason ?? job.cancellation?.report ?? 'no reason recorded';
      throw new Error(`the job ended ${job.status}: ${reason}`);
    }
    if (!result) throw new Error(`the job completed but ${resultPath} has no report`);
    if (web) {
      const references = referencesOf(result.markdown);
      const fetches = [...web.pageFetches().values()].reduce((sum, count) => sum + count, 0);
      log(`  pages fetched:     ${fetches} fetch_page requests for ${web.pageFetches().size} of ${web.pageUrls.length} local pages`);
      log(`\nReferences (${references.length}):`);
      for (const line of references) log(`  ${line}`);
      if (!references.some((line) => web.pageUrls.some((url) => line.includes(`<${url}>`)))) {
        throw new Error('the report cites none of the local web pages');
      }
    }
    return 0;
  } finally {
    if (db) await terminate(db);
    if (app) await deleteApp(app);
    log('\nStopping the stack…');
    await stopEverything();
    removeSignalHandlers();
    log(`Stopped. Total ${elapsed(startMs)}.`);
  }
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    clearBar();
    if (error instanceof DemoUsageError) {
      console.error(`${error.message}\n\n${DEMO_USAGE}`);
      process.exit(2);
    }
    console.error(`\nDemo failed: ${error instanceof Error ? error.message : String(error)}`);
    process.exit(1);
  },
);
