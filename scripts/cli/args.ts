/** The command line: one pure parse into a typed command, and the usage text. */
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { MAX_JOBS_IN_FLIGHT, MAX_SPEND_USD_PER_DAY, MAX_SUBMITS_PER_MINUTE } from '../../functions/src/core/quota';
import { PHASE_NAME_PATTERN } from '../../functions/src/core/pipeline';
import { ADMIN_ACTIONS, PIPELINE_GRANT_ACTIONS, type AdminAction, type AdminCommand, type PipelineGrantAction } from './admin-commands';
import { UsageError } from './errors';

export const USAGE = `phaseline: submit, watch and operate Phaseline jobs

Usage: phaseline [--project <id>] [--region <region>] <command> [options]

As a user (your jobs only; reads go through the Firestore security rules):
  submit <pipeline> <input-json>        Submit a job; prints its task ID (the job ID)
  submit --question "<text>"            The same for the research pipeline: {"question": "<text>"}
      --input-file <path>               Read the input JSON from a file ("-": standard input)
      --conversation <id>               Publish the answer into this conversation
      --idempotency-key <key>           Resubmitting with the same key gives the same job
      --watch                           Watch the job once it is submitted
  watch <jobId> [--report]              A progress bar and the timeline until the job completes,
                                        fails or waits for your decision; --report prints the report
  list [--limit <n>]                    Your most recent jobs (20 by default)
  cancel <jobId> [--reason <text>]      Cancel a job
  decide <jobId> <questionId> <answer>  Answer the question a waiting job asks

As an operator (admin SDK: the emulators locally, Application Default Credentials when deployed):
  list --all [--limit <n>]              The most recent jobs of every user
  release <jobId>                       Requeue a quarantined job with a fresh budget
  redrive <jobId> --from <phase>        Run a completed, failed or quarantined job again from a
      --reason "<text>"                 phase (required: why); that phase's and later phases' state
                                        is set aside for audit, applied effects are not sent again
      --by <name>                       Who re-drives it, for the timeline (default: your login name)
  sweep                                 Run one sweep now, in this process (see below)
  limits <uid>                          A user's limits: the operator's override and the defaults
      --jobs-in-flight <n|default>      Set (or clear) how many jobs the user may have in flight
      --submits-per-minute <n|default>  Set (or clear) how many jobs they may submit a minute
      --spend-usd-per-day <usd|default> Set (or clear) their model spend per UTC day in USD
      --reset                           Clear the override: the defaults apply again
  admin grant <uid>                     Make a user an operator (custom claim admin: true), for the
                                        operator console (/ops) and its actions
  admin revoke <uid>                    Take it away again (and sign the user out everywhere)
  admin allow <uid> <pipeline>          Let a signed-in user run a pipeline open to granted accounts
                                        only (notify): custom claim phaselinePipelines
  admin disallow <uid> <pipeline>       Take that back (and sign the user out everywhere)
  queue stats                           Depth and oldest task of the runJobStep Cloud Tasks queue
  queue pause | queue resume            Stop or restart dispatching (a provider outage, say)
                                        The queue commands need a deployed project: the Cloud Tasks
                                        emulator does not serve the API they use.

Where it acts:
  By default the local stack (\`npm start\`): project demo-phaseline on the emulator ports in
  firebase.json (Firestore 127.0.0.1:8080, functions 127.0.0.1:5001, Auth 127.0.0.1:9099, Cloud
  Tasks 127.0.0.1:9499; FIRESTORE_EMULATOR_HOST, FIREBASE_AUTH_EMULATOR_HOST and
  CLOUD_TASKS_EMULATOR_HOST override them). There you are a custom-token user of the Auth
  emulator whose uid is kept in ~/.phaseline/<project>.identity.json (PHASELINE_HOME moves it),
  so submit, watch, list and cancel act as the same owner.
  Any project ID that does not start with "demo-" (--project, or PHASELINE_PROJECT) is a deployed
  project: user commands need PHASELINE_ID_TOKEN (a Firebase ID token of the user); operator
  commands use Application Default Credentials (gcloud auth application-default login).
  --region or PHASELINE_REGION: the functions' region (us-central1). PHASELINE_FUNCTIONS_URL
  overrides the functions' base URL.

sweep: the functions emulator never fires the scheduled sweepJobs (firebase-tools does not load
  it at all without the Pub/Sub emulator), so \`phaseline sweep\` runs the project's sweep() in
  this process through the admin SDK, against the target's Firestore and Cloud Tasks (locally:
  FIRESTORE_EMULATOR_HOST and CLOUD_TASKS_EMULATOR_HOST pointing at the local stack).

Exit status: 0 success; 1 failed, refused or unreachable (watch: the job failed, was cancelled or
was quarantined); 2 a usage error.`;

export interface GlobalOptions {
  readonly project?: string;
  readonly region?: string;
}

export type SubmitSource =
  | { readonly kind: 'json'; readonly input: unknown }
  | { readonly kind: 'file'; readonly path: string };

export type Command =
  | { readonly name: 'help' }
  | {
      readonly name: 'submit';
      readonly pipeline: string;
      readonly source: SubmitSource;
      readonly conversationId?: string;
      readonly idempotencyKey?: string;
      readonly watch: boolean;
    }
  | { readonly name: 'watch'; readonly jobId: string; readonly report: boolean }
  | { readonly name: 'list'; readonly all: boolean; readonly limit: number }
  | { readonly name: 'cancel'; readonly jobId: string; readonly reason?: string }
  | { readonly name: 'decide'; readonly jobId: string; readonly questionId: string; readonly answer: string }
  | { readonly name: 'release'; readonly jobId: string }
  | { readonly name: 'redrive'; readonly jobId: string; readonly fromPhase: string; readonly reason: string; readonly by?: string }
  | { readonly name: 'sweep' }
  | { readonly name: 'limits'; readonly uid: string; readonly change: LimitsChange }
  | { readonly name: 'queue'; readonly action: QueueAction }
  | ({ readonly name: 'admin' } & AdminCommand);

/** Per limit: a number sets it, null clears it (the default applies), absent leaves it. */
export interface LimitsChange {
  readonly jobsInFlight?: number | null;
  readonly submitsPerMinute?: number | null;
  readonly spendUsdPerDay?: number | null;
}

export const QUEUE_ACTIONS = ['stats', 'pause', 'resume'] as const;
export type QueueAction = (typeof QUEUE_ACTIONS)[number];

export interface Invocation {
  readonly global: GlobalOptions;
  readonly command: Command;
}

/** The job IDs the engine makes (Firestore auto IDs, idempotency-derived IDs) and the HTTP endpoints accept. */
export const JOB_ID_PATTERN = /^[A-Za-z0-9_-]{1,128}$/;
export const DEFAULT_LIST_LIMIT = 20;
const MAX_LIST_LIMIT = 500;

type Options = NonNullable<ParseArgsConfig['options']>;

const GLOBAL_OPTIONS: Options = {
  project: { type: 'string' },
  region: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
};

const COMMAND_OPTIONS: Readonly<Record<Exclude<Command['name'], 'help'>, Options>> = {
  submit: {
    question: { type: 'string', short: 'q' },
    'input-file': { type: 'string' },
    conversation: { type: 'string' },
    'idempotency-key': { type: 'string' },
    watch: { type: 'boolean', short: 'w' },
  },
  watch: { report: { type: 'boolean' } },
  list: { all: { type: 'boolean', short: 'a' }, limit: { type: 'string', short: 'n' } },
  cancel: { reason: { type: 'string' } },
  decide: {},
  release: {},
  redrive: { from: { type: 'string' }, reason: { type: 'string' }, by: { type: 'string' } },
  sweep: {},
  limits: { 'jobs-in-flight': { type: 'string' }, 'submits-per-minute': { type: 'string' }, 'spend-usd-per-day': { type: 'string' }, reset: { type: 'boolean' } },
  queue: {},
  admin: {},
};

const isCommandName = (name: string): name is keyof typeof COMMAND_OPTIONS => Object.hasOwn(COMMAND_OPTIONS, name);

function jobIdArgument(value: string | undefined, command: string): string {
  if (value === undefined) throw new UsageError(`${command} needs a job ID: phaseline ${command} <jobId>`);
  if (!JOB_ID_PATTERN.test(value)) throw new UsageError(`"${value}" is not a job ID (1 to 128 letters, digits, "_" or "-"): use the task ID that submit printed`);
  return value;
}

function noMorePositionals(positionals: readonly string[], from: number, command: string): void {
  const extra = positionals.slice(from);
  if (extra.length > 0) throw new UsageError(`${command} got unexpected arguments: ${extra.map((value) => `"${value}"`).join(' ')}`);
}

export function parseJsonInput(text: string, where: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch (error) {
    throw new UsageError(`The input ${where} is not valid JSON: ${error instanceof Error ? error.message : String(error)}`);
  }
}

function positiveInteger(value: string, option: string, max: number): number {
  if (!/^\d+$/.test(value) || Number(value) < 1 || Number(value) > max) throw new UsageError(`--${option} must be a whole number from 1 to ${max}, not "${value}"`);
  return Number(value);
}

/** Finds the command word: the first argument that is neither a global option nor its value. */
function splitCommand(argv: readonly string[]): { commandIndex: number } {
  for (let index = 0; index < argv.length; index += 1) {
    const arg = argv[index] ?? '';
    if (arg === '--') return { commandIndex: index + 1 < argv.length ? index + 1 : -1 };
    if (!arg.startsWith('-')) return { commandIndex: index };
    if ((arg === '--project' || arg === '--region') && !arg.includes('=')) index += 1;
  }
  return { commandIndex: -1 };
}

function parse(argv: readonly string[], options: Options): { values: Record<string, string | boolean | undefined>; positionals: string[] } {
  try {
    const parsed = parseArgs({ args: [...argv], options, allowPositionals: true, strict: true });
    return { values: parsed.values as Record<string, string | boolean | undefined>, positionals: parsed.positionals };
  } catch (error) {
    // parseArgs explains itself ("Unknown option '--x'"); the hint says where to look.
    throw new UsageError(`${error instanceof Error ? error.message : String(error)}\nRun \`phaseline --help\` for the commands and their options.`);
  }
}

const stringOption = (values: Record<string, string | boolean | undefined>, name: string): string | undefined => {
  const value = values[name];
  return typeof value === 'string' ? value : undefined;
};

export function parseInvocation(argv: readonly string[]): Invocation {
  const { commandIndex } = splitCommand(argv);
  const commandWord = commandIndex === -1 ? undefined : argv[commandIndex];
  const rest = commandIndex === -1 ? [...argv] : [...argv.slice(0, commandIndex), ...argv.slice(commandIndex + 1)];

  if (commandWord === undefined || commandWord === 'help') {
    const { values } = parse(rest, GLOBAL_OPTIONS);
    return { global: globalOptions(values), command: { name: 'help' } };
  }
  if (!isCommandName(commandWord)) {
    throw new UsageError(`Unknown command "${commandWord}". Commands: submit, watch, list, cancel, decide, release, sweep, limits, queue (phaseline --help).`);
  }
  const { values, positionals } = parse(rest, { ...GLOBAL_OPTIONS, ...COMMAND_OPTIONS[commandWord] });
  const global = globalOptions(values);
  if (values.help === true) return { global, command: { name: 'help' } };
  return { global, command: commandFrom(commandWord, values, positionals) };
}

function globalOptions(values: Record<string, string | boolean | undefined>): GlobalOptions {
  const project = stringOption(values, 'project');
  const region = stringOption(values, 'region');
  return { ...(project === undefined ? {} : { project }), ...(region === undefined ? {} : { region }) };
}

function commandFrom(name: keyof typeof COMMAND_OPTIONS, values: Record<string, string | boolean | undefined>, positionals: readonly string[]): Command {
  switch (name) {
    case 'submit':
      return submitCommand(values, positionals);
    case 'watch':
      noMorePositionals(positionals, 1, 'watch');
      return { name: 'watch', jobId: jobIdArgument(positionals[0], 'watch'), report: values.report === true };
    case 'list': {
      noMorePositionals(positionals, 0, 'list');
      const limit = stringOption(values, 'limit');
      return { name: 'list', all: values.all === true, limit: limit === undefined ? DEFAULT_LIST_LIMIT : positiveInteger(limit, 'limit', MAX_LIST_LIMIT) };
    }
    case 'cancel': {
      noMorePositionals(positionals, 1, 'cancel');
      const reason = stringOption(values, 'reason');
      if (reason?.trim() === '') throw new UsageError('--reason must not be empty');
      return { name: 'cancel', jobId: jobIdArgument(positionals[0], 'cancel'), ...(reason === undefined ? {} : { reason }) };
    }
    case 'decide': {
      const [jobId, questionId, answer] = positionals;
      if (questionId === undefined || answer === undefined) {
        throw new UsageError('decide needs a job ID, a question ID and an answer: phaseline decide <jobId> <questionId> <answer> (watch shows them)');
      }
      noMorePositionals(positionals, 3, 'decide');
      return { name: 'decide', jobId: jobIdArgument(jobId, 'decide'), questionId, answer };
    }
    case 'release':
      noMorePositionals(positionals, 1, 'release');
      return { name: 'release', jobId: jobIdArgument(positionals[0], 'release') };
    case 'redrive':
      return redriveCommand(values, positionals);
    case 'sweep':
      noMorePositionals(positionals, 0, 'sweep');
      return { name: 'sweep' };
    case 'limits':
      return limitsCommand(values, positionals);
    case 'admin': {
      const [action, uid, pipeline] = positionals;
      const grantsPipeline = action !== undefined && (PIPELINE_GRANT_ACTIONS as readonly string[]).includes(action);
      if (action === undefined || !(grantsPipeline || (ADMIN_ACTIONS as readonly string[]).includes(action)) || uid === undefined) {
        throw new UsageError('admin needs grant or revoke and a user ID, or allow or disallow, a user ID and a pipeline: phaseline admin grant <uid>, phaseline admin allow <uid> <pipeline>');
      }
      if (!UID_PATTERN.test(uid)) throw new UsageError(`"${uid}" is not a user ID (1 to 128 characters, no "/" or spaces)`);
      if (grantsPipeline) {
        if (pipeline === undefined) throw new UsageError(`admin ${action} needs a pipeline after the user ID: phaseline admin ${action} ${uid} notify`);
        if (!PIPELINE_NAME_PATTERN.test(pipeline)) throw new UsageError(`"${pipeline}" is not a pipeline name (lower-case letters, digits and "-")`);
        noMorePositionals(positionals, 3, 'admin');
        return { name: 'admin', action: action as PipelineGrantAction, uid, pipeline };
      }
      noMorePositionals(positionals, 2, 'admin');
      return { name: 'admin', action: action as AdminAction, uid };
    }
    case 'queue': {
      const action = positionals[0];
      if (action === undefined || !(QUEUE_ACTIONS as readonly string[]).includes(action)) {
        throw new UsageError(`queue needs one of ${QUEUE_ACTIONS.join(', ')}: phaseline queue stats`);
      }
      noMorePositionals(positionals, 1, 'queue');
      return { name: 'queue', action: action as QueueAction };
    }
  }
}

function submitCommand(values: Record<string, string | boolean | undefined>, positionals: readonly string[]): Command {
  const question = stringOption(values, 'question');
  const inputFile = stringOption(values, 'input-file');
  const conversationId = stringOption(values, 'conversation');
  const idempotencyKey = stringOption(values, 'idempotency-key');
  const extras = {
    ...(conversationId === undefined ? {} : { conversationId }),
    ...(idempotencyKey === undefined ? {} : { idempotencyKey }),
    watch: values.watch === true,
  };
  if (question !== undefined) {
    if (positionals.length > 0 || inputFile !== undefined) {
      throw new UsageError('--question submits to the research pipeline by itself: give either --question or a pipeline with its input, not both');
    }
    return { name: 'submit', pipeline: 'research', source: { kind: 'json', input: { question } }, ...extras };
  }
  const [pipeline, inputJson] = positionals;
  if (pipeline === undefined) throw new UsageError('submit needs a pipeline and its input, or --question: phaseline submit research \'{"question": "..."}\'');
  if (inputFile !== undefined) {
    if (inputJson !== undefined) throw new UsageError('Give the input either as an argument or with --input-file, not both');
    return { name: 'submit', pipeline, source: { kind: 'file', path: inputFile }, ...extras };
  }
  if (inputJson === undefined) throw new UsageError(`submit ${pipeline} needs the input as JSON (an argument, or --input-file <path>)`);
  noMorePositionals(positionals, 2, 'submit');
  return { name: 'submit', pipeline, source: { kind: 'json', input: parseJsonInput(inputJson, 'argument') }, ...extras };
}

function redriveCommand(values: Record<string, string | boolean | undefined>, positionals: readonly string[]): Command {
  noMorePositionals(positionals, 1, 'redrive');
  const jobId = jobIdArgument(positionals[0], 'redrive');
  const fromPhase = stringOption(values, 'from');
  if (fromPhase === undefined) throw new UsageError('redrive needs the phase to run again from: phaseline redrive <jobId> --from <phase> --reason "<why>"');
  if (!PHASE_NAME_PATTERN.test(fromPhase)) throw new UsageError(`--from must be a phase name (lower-case letters, digits and "-"), not "${fromPhase}"`);
  const reason = stringOption(values, 'reason');
  if (reason === undefined || reason.trim() === '') throw new UsageError('redrive needs --reason "<why>": the job\'s timeline records who re-drove it and why');
  const by = stringOption(values, 'by');
  if (by?.trim() === '') throw new UsageError('--by must not be empty');
  return { name: 'redrive', jobId, fromPhase, reason, ...(by === undefined ? {} : { by }) };
}

/** A limit's value: a whole number in range, or "default" to clear the operator's value. */
function limitValue(value: string, option: string, max: number): number | null {
  if (value === 'default') return null;
  if (!/^\d+$/.test(value) || Number(value) > max) throw new UsageError(`--${option} must be a whole number from 0 to ${max}, or "default", not "${value}"`);
  return Number(value);
}

function spendValue(value: string): number | null {
  if (value === 'default') return null;
  if (!/^\d+(\.\d{1,2})?$/.test(value) || Number(value) > MAX_SPEND_USD_PER_DAY) {
    throw new UsageError(`--spend-usd-per-day must be an amount in USD from 0 to ${MAX_SPEND_USD_PER_DAY} with at most two decimals, or "default", not "${value}"`);
  }
  return Number(value);
}

/** Firebase uids are at most 128 characters; a document ID may not contain "/". */
const UID_PATTERN = /^[^/\s]{1,128}$/;
// Pipeline names follow the phase-name rule (the registry's names: canary, research, notify).
const PIPELINE_NAME_PATTERN = PHASE_NAME_PATTERN;

function limitsCommand(values: Record<string, string | boolean | undefined>, positionals: readonly string[]): Command {
  const [uid] = positionals;
  if (uid === undefined) throw new UsageError('limits needs a user ID: phaseline limits <uid> [--jobs-in-flight <n>] [--submits-per-minute <n>] [--spend-usd-per-day <usd>]');
  if (!UID_PATTERN.test(uid)) throw new UsageError(`"${uid}" is not a user ID (1 to 128 characters, no "/" or spaces)`);
  noMorePositionals(positionals, 1, 'limits');
  const jobsInFlight = stringOption(values, 'jobs-in-flight');
  const submitsPerMinute = stringOption(values, 'submits-per-minute');
  const spendUsdPerDay = stringOption(values, 'spend-usd-per-day');
  if (values.reset === true) {
    if (jobsInFlight !== undefined || submitsPerMinute !== undefined || spendUsdPerDay !== undefined) throw new UsageError('--reset clears every limit of the user: give it alone');
    return { name: 'limits', uid, change: { jobsInFlight: null, submitsPerMinute: null, spendUsdPerDay: null } };
  }
  const change: { -readonly [K in keyof LimitsChange]: LimitsChange[K] } = {};
  if (jobsInFlight !== undefined) change.jobsInFlight = limitValue(jobsInFlight, 'jobs-in-flight', MAX_JOBS_IN_FLIGHT);
  if (submitsPerMinute !== undefined) change.submitsPerMinute = limitValue(submitsPerMinute, 'submits-per-minute', MAX_SUBMITS_PER_MINUTE);
  if (spendUsdPerDay !== undefined) change.spendUsdPerDay = spendValue(spendUsdPerDay);
  return { name: 'limits', uid, change };
}
