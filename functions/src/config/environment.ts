/**
 * Every `PHASELINE_*` environment variable the functions read, declared once: its name, how its
 * text is parsed (zod), its default and what it does. Nothing else in functions/src names one, and
 * the README's Configuration section lists exactly these (test/unit/config-declarations.test.ts).
 *
 * Sections are parsed when the code that needs them first runs: the engine options by every
 * trigger, the provider and the research tools when a research step runs, the receiver when a
 * notify job (or the sweeper, for a stopped notify job) needs it. So a malformed receiver setting fails notify jobs by name and
 * leaves research alone, as before. Blank text counts as unset. Errors name the variable and what
 * it must be; they are terminal (`invalid_input`), so a step that meets one fails its job with the
 * reason instead of retrying against settings that will not change.
 *
 * This module sits below pipelines/ and triggers/ (both read it; pipelines may not import
 * triggers/), so it lives in its own folder rather than in triggers/config.ts.
 */
import { z } from 'zod';
import { TerminalError } from '../core/errors';
import { DEFAULT_ENGINE_OPTIONS, resolveEngineOptions, type EngineOptions } from '../core/options';
import { DEFAULT_ANONYMOUS_JOBS_IN_FLIGHT_TOTAL, DEFAULT_QUOTA_DEFAULTS, MAX_ANONYMOUS_JOBS_IN_FLIGHT_TOTAL, MAX_JOBS_IN_FLIGHT, MAX_SPEND_USD_PER_DAY, MAX_SUBMITS_PER_MINUTE, type QuotaDefaults } from '../core/quota';
import { DEFAULT_SECTION_POLICY, type SectionPolicy } from '../agent/section-runner';
import type { AllowedAddress, PageFetchLimits } from '../agent/web/page-fetcher';
import { DEFAULT_OFFLINE_SETTINGS, offlineSettingsSchema, type OfflineSettings } from '../providers/offline/settings';
import { openAiCompatibleConfigSchema, type OpenAiCompatibleConfig } from '../providers/openai-compatible';
import { TRACE_EXPORTERS, type TracingConfig } from '../telemetry/tracing';

/** A setting is missing or malformed; the message names the variable and what it must be. */
export class ConfigurationError extends TerminalError {
  constructor(message: string) {
    super(message, { code: 'invalid_input' });
  }
}

/** Environment variables as read (process.env by default): every reader here takes one, so tests pass their own. */
export type Environment = Readonly<Record<string, string | undefined>>;

interface Variable<S extends z.ZodType = z.ZodType> {
  /** Parses the variable's trimmed text, or `undefined` when it is unset or blank. */
  readonly schema: S;
  /** The value when unset, as the README's Configuration section shows it. */
  readonly defaultText: string;
  readonly description: string;
}

function variable<S extends z.ZodType>(schema: S, defaultText: string, description: string): Variable<S> {
  return { schema, defaultText, description };
}

const numberText = z.string().transform((text, context) => {
  const value = Number(text);
  if (Number.isFinite(value)) return value;
  context.addIssue({ code: 'custom', message: 'must be a number' });
  return z.NEVER;
});

const jsonText = z.string().transform((text, context): unknown => {
  try {
    return JSON.parse(text);
  } catch {
    context.addIssue({ code: 'custom', message: 'is not valid JSON' });
    return z.NEVER;
  }
});

const receiverUrlText = z.string({ error: 'is not set: the notify pipeline has no receiver to send through' }).transform((text, context) => {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    context.addIssue({ code: 'custom', message: 'is not a URL' });
    return z.NEVER;
  }
  if (url.protocol === 'http:' || url.protocol === 'https:') return { text, host: url.host };
  context.addIssue({ code: 'custom', message: 'must be an http(s) URL' });
  return z.NEVER;
});

const positiveNumberText = numberText.pipe(z.number().positive('must be a positive number'));

interface EngineVariable extends Variable<z.ZodOptional<typeof numberText>> {
  readonly option: keyof EngineOptions;
}

/** Engine options: overrides of core/options' defaults, validated there (ranges, cross-field rules). */
function engineOption(option: keyof EngineOptions, description: string): EngineVariable {
  return { option, schema: numberText.optional(), defaultText: String(DEFAULT_ENGINE_OPTIONS[option]), description };
}

const ENGINE_VARIABLES = {
  PHASELINE_LEASE_SECONDS: engineOption('leaseSeconds', 'A lease nobody renews expires this long after its last renewal: the sweeper reclaims it.'),
  PHASELINE_SWEEP_INTERVAL_SECONDS: engineOption('sweepIntervalSeconds', 'How often within each scheduled minute the sweeper looks for expired leases and lost tasks.'),
  PHASELINE_HEARTBEAT_SECONDS: engineOption('heartbeatSeconds', 'How often a working step renews its lease, coalesced with progress writes.'),
  PHASELINE_STALE_HEARTBEAT_SECONDS: engineOption('staleHeartbeatSeconds', 'A holder silent this long (no renewal confirmed) starts nothing more; a task finding its step held by a worker silent this long plus PHASELINE_CLOCK_SKEW_SECONDS takes it over with a new epoch.'),
  PHASELINE_CLOCK_SKEW_SECONDS: engineOption('clockSkewSeconds', "The most two instances' clocks may differ: a redelivered task takes a claim over this long after its holder stopped starting calls."),
  PHASELINE_PROGRESS_TIMEOUT_SECONDS: engineOption('progressTimeoutSeconds', 'A step without progress this long stops renewing its lease and gives the job back.'),
  PHASELINE_PROGRESS_FLUSH_MS: engineOption('progressFlushMs', 'Minimum gap between two coalesced progress writes to the job document.'),
  PHASELINE_STEP_BUDGET_SECONDS: engineOption('stepBudgetSeconds', 'A step starts no new section once this much of its time is used.'),
  PHASELINE_MAX_ATTEMPTS: engineOption('maxAttempts', 'Caught errors a job may have before it fails.'),
  PHASELINE_MAX_STALE_RECLAIMS: engineOption('maxStaleReclaims', 'Workers a job may lose without progress before it is quarantined.'),
  PHASELINE_BACKOFF_BASE_SECONDS: engineOption('backoffBaseSeconds', 'Base of the full-jitter backoff after a retryable error.'),
  PHASELINE_BACKOFF_MAX_SECONDS: engineOption('backoffMaxSeconds', 'Cap of that backoff.'),
  PHASELINE_LOST_TASK_GRACE_SECONDS: engineOption('lostTaskGraceSeconds', 'A queued job not claimed this long after it was due is re-dispatched by the sweeper.'),
  PHASELINE_SWEEP_BATCH_SIZE: engineOption('sweepBatchSize', 'Documents the sweeper handles per query per run.'),
  PHASELINE_WRITE_RETRIES: engineOption('writeRetries', 'In-call retries of a Firestore write before the step gives up on it.'),
  PHASELINE_MAX_SERVER_DELAY_SECONDS: engineOption('maxServerDelaySeconds', 'Cap on any Retry-After; a longer one is an outage and the job waits.'),
  PHASELINE_RETENTION_DAYS: engineOption('retentionDays', "Days an ended job's transcripts, events and artifacts, and a rejected task, are kept before Firestore's TTL deletes them."),
} satisfies Record<string, EngineVariable>;

const PROVIDER_KINDS = ['offline', 'openai-compatible'] as const;
export type ProviderKind = (typeof PROVIDER_KINDS)[number];

const PROVIDER_VARIABLES = {
  PHASELINE_PROVIDER: variable(
    z.enum(PROVIDER_KINDS, { error: `must be ${PROVIDER_KINDS.join(' or ')}` }).default('offline'),
    'offline',
    'The model provider: the offline simulator (no key, no network) or a Chat Completions-compatible endpoint.',
  ),
};

const OFFLINE_VARIABLES = {
  PHASELINE_OFFLINE_SETTINGS: variable(
    jsonText.pipe(offlineSettingsSchema).default(DEFAULT_OFFLINE_SETTINGS),
    '{}',
    "The offline simulator's settings as JSON (latency, error waves, fault rates, prices; providers/offline/settings.ts).",
  ),
  PHASELINE_OFFLINE_SEED: variable(numberText.pipe(z.int()).default(1), '1', 'Seed of the offline simulator and the corpus tools: a run replays exactly with the same seed.'),
};

const model = openAiCompatibleConfigSchema.shape;
const MODEL_VARIABLES = {
  PHASELINE_MODEL_BASE_URL: variable(model.baseUrl.default('https://api.openai.com/v1'), 'https://api.openai.com/v1', 'Base URL of the Chat Completions endpoint (`/chat/completions` is appended).'),
  PHASELINE_MODEL: variable(model.model.default('gpt-4o-mini'), 'gpt-4o-mini', 'The model name sent with every request.'),
  PHASELINE_MODEL_API_KEY: variable(model.apiKey, 'unset', 'Bearer token for the endpoint; a Secret Manager secret, bound only when the provider is openai-compatible.'),
  PHASELINE_MODEL_TIMEOUT_MS: variable(numberText.pipe(model.timeoutMs).default(120_000), '120000', 'Longest wait for one model call (also bounded by the step deadline).'),
  PHASELINE_MODEL_CONTEXT_TOKENS: variable(numberText.pipe(model.contextWindowTokens).default(128_000), '128000', 'Context window; a request estimated above it is refused before it is sent.'),
  PHASELINE_MODEL_INPUT_USD_PER_1K: variable(numberText.pipe(model.inputUsdPer1kTokens).optional(), 'unset', "Price of 1,000 input tokens, for the job's cost and the daily spend limit. Required: unset, the functions do not load."),
  PHASELINE_MODEL_OUTPUT_USD_PER_1K: variable(numberText.pipe(model.outputUsdPer1kTokens).optional(), 'unset', 'Price of 1,000 output tokens. Required, as the input price.'),
};

/** The provider's prices: unset, every call of a priced provider would cost $0 and no daily spend limit would stop it. */
const PRICE_VARIABLES = ['PHASELINE_MODEL_INPUT_USD_PER_1K', 'PHASELINE_MODEL_OUTPUT_USD_PER_1K'] as const;

/** The refusal of a priced provider whose prices (all or some) are unset, naming them. */
function unpricedProviderError(unset: readonly string[]): ConfigurationError {
  const named = unset.length === 1 ? `${unset.join('')} is` : `${unset.join(' and ')} are`;
  return new ConfigurationError(
    `${named} not set: the openai-compatible provider bills by the token, and without its prices every call would cost $0 and no daily spend limit would stop it. ` +
      `Set both to the endpoint's USD price per 1,000 tokens (0 only for an endpoint that costs nothing).`,
  );
}

/** How agent sections run (agent/section-runner.ts), read when a research step runs. */
const AGENT_VARIABLES = {
  PHASELINE_MAX_TOOL_CALLS_PER_ANSWER: variable(
    numberText.pipe(z.int().min(1).max(100)).default(DEFAULT_SECTION_POLICY.maxToolCallsPerAnswer),
    String(DEFAULT_SECTION_POLICY.maxToolCallsPerAnswer),
    'Tool calls one model answer may have run; each call past it gets a tool error result (not run) that the model reads.',
  ),
};

const RECEIVER_VARIABLES = {
  PHASELINE_RECEIVER_URL: variable(receiverUrlText, 'unset', 'The system of record the notify pipeline sends through; configuration only, never the job input. Required by notify.'),
  PHASELINE_RECEIVER_TIMEOUT_MS: variable(positiveNumberText.default(10_000), '10000', 'Longest wait for one receiver request; past it the effect is unknown and reconciled.'),
  PHASELINE_RECEIVER_WAIT_SECONDS: variable(positiveNumberText.default(60), '60', 'How long a notify job waits (reason provider) when the receiver is unavailable.'),
};

const SEARCH_KINDS = ['corpus', 'searxng', 'tavily'] as const;
export type SearchKind = (typeof SEARCH_KINDS)[number];

const httpUrl = z.url({ protocol: /^https?$/ });

const SEARCH_VARIABLES = {
  PHASELINE_SEARCH: variable(
    z.enum(SEARCH_KINDS, { error: `must be ${SEARCH_KINDS.join(', ')}` }).default('corpus'),
    'corpus',
    'The research tools: search and read over the bundled corpus (offline), or web search through SearXNG or Tavily plus fetch_page.',
  ),
  PHASELINE_SEARCH_TIMEOUT_MS: variable(numberText.pipe(z.int().min(1).max(300_000)).default(15_000), '15000', 'Longest wait for one web search.'),
};

const SEARXNG_VARIABLES = {
  PHASELINE_SEARXNG_URL: variable(
    z.string({ error: 'is not set: PHASELINE_SEARCH=searxng needs the base URL of the SearXNG instance' }).pipe(httpUrl),
    'unset',
    'Base URL of the SearXNG instance (json enabled under search.formats). Required when PHASELINE_SEARCH is searxng.',
  ),
};

const TAVILY_VARIABLES = {
  PHASELINE_TAVILY_API_KEY: variable(
    z.string({ error: 'is not set: PHASELINE_SEARCH=tavily needs an API key' }),
    'unset',
    'Tavily API key: a Secret Manager secret, bound only when PHASELINE_SEARCH is tavily. Required then; never echoed.',
  ),
  PHASELINE_TAVILY_BASE_URL: variable(httpUrl.default('https://api.tavily.com'), 'https://api.tavily.com', "Tavily's API endpoint (tests point it at a local server)."),
};

/**
 * A comma-separated list of `address:port` entries (`[address]:port` for IPv6; the address may be a
 * CIDR range); blank entries ignored. An address without a port is refused, not read as every port.
 */
const allowedAddressListText = z.string().transform((text, context): AllowedAddress[] => {
  const entries = text
    .split(',')
    .map((entry) => entry.trim())
    .filter((entry) => entry !== '');
  const parsed = entries.map((entry) => ({ entry, allowed: allowedAddressOf(entry) }));
  const invalid = parsed.filter(({ allowed }) => allowed === undefined).map(({ entry }) => entry);
  if (invalid.length === 0) return parsed.flatMap(({ allowed }) => (allowed === undefined ? [] : [allowed]));
  const portless = invalid.some((entry) => z.union([z.ipv4(), z.ipv6(), z.cidrv4(), z.cidrv6()]).safeParse(entry.replace(/^\[(.*)\]$/, '$1')).success);
  context.addIssue({
    code: 'custom',
    message:
      'must list address:port entries separated by commas (an IP address or CIDR range and the one port it may be reached on, e.g. 127.0.0.1:8080, [::1]:8080, 10.20.0.0/16:443)' +
      `${portless ? '; an address without a port would open all its ports' : ''}; not ${invalid.map((entry) => JSON.stringify(entry)).join(', ')}`,
  });
  return z.NEVER;
});

function allowedAddressOf(entry: string): AllowedAddress | undefined {
  const bracketed = /^\[([^\]]+)\]:(\d{1,5})$/.exec(entry);
  const plain = bracketed === null ? /^([^:[\]]+):(\d{1,5})$/.exec(entry) : null;
  const [, address = '', portText = ''] = bracketed ?? plain ?? [];
  const port = Number(portText);
  if (address === '' || !Number.isInteger(port) || port < 1 || port > 65_535) return undefined;
  const form = bracketed === null ? z.union([z.ipv4(), z.cidrv4()]) : z.union([z.ipv6(), z.cidrv6()]);
  return form.safeParse(address).success ? { address, port } : undefined;
}

const PAGE_VARIABLES = {
  PHASELINE_FETCH_TIMEOUT_MS: variable(numberText.pipe(z.int().min(1).max(300_000)).default(15_000), '15000', 'Longest fetch_page may take, every redirect and the body included.'),
  PHASELINE_FETCH_MAX_BYTES: variable(
    numberText.pipe(z.int().min(1_000).max(100_000_000)).default(2_000_000),
    '2000000',
    'fetch_page reads at most this many bytes of a page (decoded) and says when it stopped there; the page is parsed in a worker thread, within a time limit.',
  ),
  PHASELINE_FETCH_MAX_REDIRECTS: variable(numberText.pipe(z.int().min(0).max(20)).default(5), '5', 'Redirects fetch_page follows, each hop checked against the address rules.'),
  PHASELINE_FETCH_TOKEN_BUDGET: variable(
    numberText.pipe(z.int().min(100).max(100_000)).default(4_000),
    '4000',
    "Estimated tokens of a page's readable text given to the model; the full text is kept as an artifact.",
  ),
  PHASELINE_FETCH_MAX_BYTES_PER_JOB: variable(
    numberText.pipe(z.int().min(1_000).max(10_000_000_000)).default(20_000_000),
    '20000000',
    "Bytes of artifacts (page texts, large tool results) a job may hold when fetch_page keeps another page; a page past it is a tool error the model reads, not kept.",
  ),
  PHASELINE_FETCH_ALLOWED_ADDRESSES: variable(
    allowedAddressListText.default([]),
    'unset',
    'address:port entries (IP address or CIDR range, and one port) fetch_page may reach although they are not public (e.g. 127.0.0.1:8080 for local tests); every other port of those addresses, and everything else non-public, is refused.',
  ),
};

/** A count per user, 0 to `max`, and a USD spend per day: the default they document is the one they parse to. */
const quotaLimit = (max: number, fallback: number, description: string) => variable(numberText.pipe(z.int().min(0).max(max)).default(fallback), String(fallback), description);
const spendCap = (fallback: number, description: string) => variable(numberText.pipe(z.number().min(0).max(MAX_SPEND_USD_PER_DAY)).default(fallback), String(fallback), description);

/** Limits per user at submit (core/quota.ts); an operator's userLimits/{uid} document overrides them per user. */
const QUOTA_VARIABLES = {
  PHASELINE_QUOTA_JOBS_IN_FLIGHT: quotaLimit(MAX_JOBS_IN_FLIGHT, DEFAULT_QUOTA_DEFAULTS.signedIn.jobsInFlight, 'Jobs a signed-in user may have in flight (not completed, failed or cancelled) at once; submitJob answers 429 past it.'),
  PHASELINE_QUOTA_SUBMITS_PER_MINUTE: quotaLimit(MAX_SUBMITS_PER_MINUTE, DEFAULT_QUOTA_DEFAULTS.signedIn.submitsPerMinute, 'Jobs a signed-in user may submit in any 60 seconds.'),
  PHASELINE_QUOTA_ANONYMOUS_JOBS_IN_FLIGHT: quotaLimit(MAX_JOBS_IN_FLIGHT, DEFAULT_QUOTA_DEFAULTS.anonymous.jobsInFlight, 'The same for anonymous accounts.'),
  PHASELINE_QUOTA_ANONYMOUS_SUBMITS_PER_MINUTE: quotaLimit(MAX_SUBMITS_PER_MINUTE, DEFAULT_QUOTA_DEFAULTS.anonymous.submitsPerMinute, 'The same for anonymous accounts.'),
  PHASELINE_QUOTA_SPEND_USD_PER_DAY: spendCap(DEFAULT_QUOTA_DEFAULTS.signedIn.spendUsdPerDay, "A signed-in user's model spend per UTC day in USD, wasted calls included: a running job at it waits (reason `budget`) until the day ends or its owner resumes it, and submitJob answers 429."),
  PHASELINE_QUOTA_ANONYMOUS_SPEND_USD_PER_DAY: spendCap(DEFAULT_QUOTA_DEFAULTS.anonymous.spendUsdPerDay, 'The same for anonymous accounts.'),
  PHASELINE_QUOTA_ANONYMOUS_JOBS_IN_FLIGHT_TOTAL: quotaLimit(MAX_ANONYMOUS_JOBS_IN_FLIGHT_TOTAL, DEFAULT_ANONYMOUS_JOBS_IN_FLIGHT_TOTAL, 'Jobs of all anonymous accounts together that may be in flight at once (fresh accounts are free to make); submitJob answers 429 past it.'),
};

/** Cloud Tasks' dispatch limits of the step queue, read when the functions load (at deploy, and when an emulator loads them). */
const STEP_QUEUE_VARIABLES = {
  PHASELINE_STEP_QUEUE_CONCURRENCY: variable(
    numberText.pipe(z.number().int().min(1).max(5000)).default(100),
    '100',
    'Step and unit tasks the queue runs at once. Each runs in its own function instance (the functions emulator: its own worker process, kept until it stops), so this bounds instances and, locally, memory.',
  ),
  PHASELINE_STEP_QUEUE_DISPATCHES_PER_SECOND: variable(numberText.pipe(z.number().positive().max(500)).default(50), '50', 'Step and unit tasks the queue starts per second at most.'),
};

/** Traces of steps, model calls, tool calls and commits (telemetry/tracing.ts); read once, when the step function first runs. */
const TRACE_VARIABLES = {
  PHASELINE_TRACE_EXPORTER: variable(
    z.enum(TRACE_EXPORTERS, { error: `must be ${TRACE_EXPORTERS.join(', ')}` }).default('none'),
    'none',
    'Where OpenTelemetry spans go: nowhere (the no-op tracer), one JSON log line per span, or OTLP/HTTP to PHASELINE_TRACE_OTLP_URL.',
  ),
  PHASELINE_TRACE_OTLP_URL: variable(httpUrl.default('http://localhost:4318/v1/traces'), 'http://localhost:4318/v1/traces', 'Where otlp sends spans (OTLP/HTTP): a collector, which can forward them to Cloud Trace.'),
  PHASELINE_TRACE_SAMPLE_RATIO: variable(
    numberText.pipe(z.number().min(0).max(1)).default(1),
    '1',
    'Share of traces recorded, decided by trace ID (every step of a trace alike); the request header\'s sampled flag is not followed.',
  ),
};

/** The secret's name, for binding it to the step function (firebase-functions' defineSecret). */
export const MODEL_API_KEY_VARIABLE = 'PHASELINE_MODEL_API_KEY' satisfies keyof typeof MODEL_VARIABLES;
/** For tools that start the functions with a receiver of their own. */
export const RECEIVER_URL_VARIABLE = 'PHASELINE_RECEIVER_URL' satisfies keyof typeof RECEIVER_VARIABLES;
/** The Tavily key's secret name. */
export const TAVILY_API_KEY_VARIABLE = 'PHASELINE_TAVILY_API_KEY' satisfies keyof typeof TAVILY_VARIABLES;

const SECTIONS = {
  engine: ENGINE_VARIABLES,
  provider: PROVIDER_VARIABLES,
  offline: OFFLINE_VARIABLES,
  model: MODEL_VARIABLES,
  agent: AGENT_VARIABLES,
  receiver: RECEIVER_VARIABLES,
  search: SEARCH_VARIABLES,
  searxng: SEARXNG_VARIABLES,
  tavily: TAVILY_VARIABLES,
  pages: PAGE_VARIABLES,
  quotas: QUOTA_VARIABLES,
  stepQueue: STEP_QUEUE_VARIABLES,
  traces: TRACE_VARIABLES,
} as const;

export interface DeclaredVariable {
  readonly name: string;
  readonly section: keyof typeof SECTIONS;
  readonly defaultText: string;
  readonly description: string;
}

/** Every variable, in declaration order: what the README lists and the tests check. */
export const DECLARED_VARIABLES: readonly DeclaredVariable[] = Object.entries(SECTIONS).flatMap(([section, variables]) =>
  Object.entries(variables).map(([name, declared]: [string, Variable]) => ({
    name,
    section: section as keyof typeof SECTIONS,
    defaultText: declared.defaultText,
    description: declared.description,
  })),
);

type Shape<V extends Record<string, Variable>> = { [K in keyof V]: V[K]['schema'] };
type Parsed<V extends Record<string, Variable>> = z.output<z.ZodObject<Shape<V>>>;

const MAX_ECHOED_CHARS = 80;
/** Never echoed in an error message. */
const SECRET_VARIABLES: ReadonlySet<string> = new Set([MODEL_API_KEY_VARIABLE, TAVILY_API_KEY_VARIABLE]);

/** Messages in the variables' terms: "must be at least 1", not zod's wording for developers. */
function describeIssue(issue: z.core.$ZodRawIssue): string | undefined {
  switch (issue.code) {
    case 'too_small':
      return `must be ${issue.inclusive === false ? 'more than' : 'at least'} ${String(issue.minimum)}`;
    case 'too_big':
      return `must be ${issue.inclusive === false ? 'less than' : 'at most'} ${String(issue.maximum)}`;
    case 'invalid_type':
      return `must be ${issue.expected === 'int' ? 'an integer' : `a ${issue.expected}`}`;
    case 'invalid_format':
      return issue.format === 'url' ? 'must be an http(s) URL' : `must be a ${issue.format}`;
    case 'invalid_value':
      return `must be one of ${issue.values.map(String).join(', ')}`;
    case 'unrecognized_keys':
      return `has unknown fields ${issue.keys.join(', ')}`;
    default:
      return undefined;
  }
}

function echo(value: unknown): string {
  const text = typeof value === 'string' ? value : JSON.stringify(value);
  return JSON.stringify(text.length > MAX_ECHOED_CHARS ? `${text.slice(0, MAX_ECHOED_CHARS)}…` : text);
}

/** "NAME must be …, got "text"" for the variable itself; "NAME: field must be …" inside a JSON value. */
function formatIssue(issue: z.core.$ZodIssue, text: Environment): string {
  const [name = '', ...path] = issue.path.map(String);
  if (path.length > 0) return `${name}: ${path.join('.')} ${issue.message}`;
  const raw = text[name];
  return raw === undefined || SECRET_VARIABLES.has(name) ? `${name} ${issue.message}` : `${name} ${issue.message}, got ${echo(raw)}`;
}

function parseSection<V extends Record<string, Variable>>(variables: V, env: Environment): Parsed<V> {
  const text: Record<string, string | undefined> = {};
  for (const name of Object.keys(variables)) {
    const value = env[name]?.trim();
    text[name] = value === '' ? undefined : value;
  }
  const shape = Object.fromEntries(Object.entries(variables).map(([name, declared]) => [name, declared.schema])) as Shape<V>;
  const parsed = z.object(shape).safeParse(text, { error: describeIssue });
  if (parsed.success) return parsed.data;
  throw new ConfigurationError(parsed.error.issues.map((issue) => formatIssue(issue, text)).join('; '));
}

/** The engine options; unset variables keep core/options' defaults, and the result is validated there. */
export function engineOptionsFromEnv(env: Environment = process.env): EngineOptions {
  const parsed = parseSection(ENGINE_VARIABLES, env);
  const overrides: Partial<Record<keyof EngineOptions, number>> = {};
  for (const [name, declared] of Object.entries(ENGINE_VARIABLES) as [keyof typeof ENGINE_VARIABLES, EngineVariable][]) {
    const value = parsed[name];
    if (value !== undefined) overrides[declared.option] = value;
  }
  try {
    return resolveEngineOptions(overrides);
  } catch (error) {
    // core/options speaks in option names; say which variables set the options it names.
    const message = error instanceof Error ? error.message : String(error);
    const named = Object.entries(ENGINE_VARIABLES)
      .filter(([, declared]) => new RegExp(`\\b${declared.option}\\b`).test(message))
      .map(([name, declared]) => (overrides[declared.option] === undefined ? `${name} unset (default ${declared.defaultText})` : `${name}=${String(overrides[declared.option])}`));
    throw new ConfigurationError(named.length > 0 ? `${message} (${named.join(', ')})` : message);
  }
}

export interface StepQueueLimits {
  readonly maxConcurrentDispatches: number;
  readonly maxDispatchesPerSecond: number;
}

/** The step queue's rate limits, for the task-queue function's options. */
export function stepQueueLimitsFromEnv(env: Environment = process.env): StepQueueLimits {
  const text = parseSection(STEP_QUEUE_VARIABLES, env);
  return { maxConcurrentDispatches: text.PHASELINE_STEP_QUEUE_CONCURRENCY, maxDispatchesPerSecond: text.PHASELINE_STEP_QUEUE_DISPATCHES_PER_SECOND };
}

export interface OfflineConfig {
  readonly settings: OfflineSettings;
  readonly seed: number;
}

/** The model provider the configuration chose: the offline simulator, or an OpenAI-compatible endpoint with its model and prices. */
export type ProviderConfig =
  | { readonly kind: 'offline'; readonly offline: OfflineConfig }
  | { readonly kind: 'openai-compatible'; readonly offline: OfflineConfig; readonly model: OpenAiCompatibleConfig };

/**
 * The model provider's settings. The offline settings serve both kinds (the corpus tools are the
 * research sources either way); the model settings are read only for the openai-compatible kind.
 */
export function providerConfigFromEnv(env: Environment = process.env): ProviderConfig {
  const { PHASELINE_PROVIDER: kind } = parseSection(PROVIDER_VARIABLES, env);
  const offlineText = parseSection(OFFLINE_VARIABLES, env);
  const offline = { settings: offlineText.PHASELINE_OFFLINE_SETTINGS, seed: offlineText.PHASELINE_OFFLINE_SEED };
  if (kind === 'offline') return { kind, offline };
  const text = parseSection(MODEL_VARIABLES, env);
  const { PHASELINE_MODEL_INPUT_USD_PER_1K: inputUsdPer1kTokens, PHASELINE_MODEL_OUTPUT_USD_PER_1K: outputUsdPer1kTokens } = text;
  if (inputUsdPer1kTokens === undefined || outputUsdPer1kTokens === undefined) throw unpricedProviderError(PRICE_VARIABLES.filter((name) => text[name] === undefined));
  const model: OpenAiCompatibleConfig = {
    baseUrl: text.PHASELINE_MODEL_BASE_URL,
    model: text.PHASELINE_MODEL,
    timeoutMs: text.PHASELINE_MODEL_TIMEOUT_MS,
    contextWindowTokens: text.PHASELINE_MODEL_CONTEXT_TOKENS,
    inputUsdPer1kTokens,
    outputUsdPer1kTokens,
    ...(text.PHASELINE_MODEL_API_KEY === undefined ? {} : { apiKey: text.PHASELINE_MODEL_API_KEY }),
  };
  return { kind, offline, model };
}

/**
 * Run when the step function loads (at deploy, too): a priced provider with a price unset stops
 * the functions loading, naming the variables, so it never runs uncapped. Like modelApiKeyNeeded it
 * leaves any other malformed provider setting to the step that reads it.
 */
export function refuseUnpricedProvider(env: Environment = process.env): void {
  if (!modelApiKeyNeeded(env)) return;
  // Blank counts as unset, as everywhere here; a malformed price is the step's to report.
  const unset = PRICE_VARIABLES.filter((name) => (env[name]?.trim() ?? '') === '');
  if (unset.length > 0) throw unpricedProviderError(unset);
}

/**
 * Whether the step function binds the model API key secret. Evaluated when the functions load (at
 * deploy), so it never throws: a malformed provider setting is reported when a step reads it.
 */
export function modelApiKeyNeeded(env: Environment = process.env): boolean {
  try {
    return parseSection(PROVIDER_VARIABLES, env).PHASELINE_PROVIDER === 'openai-compatible';
  } catch {
    return false;
  }
}

/** The agent sections' settings that configuration may change (the rest keep DEFAULT_SECTION_POLICY). */
export function sectionPolicyFromEnv(env: Environment = process.env): Pick<SectionPolicy, 'maxToolCallsPerAnswer'> {
  return { maxToolCallsPerAnswer: parseSection(AGENT_VARIABLES, env).PHASELINE_MAX_TOOL_CALLS_PER_ANSWER };
}

/** The notify pipeline's receiver as configured: its URL, host, request timeout and pause length. */
export interface ReceiverConfig {
  /** As configured (trimmed). */
  readonly url: string;
  readonly host: string;
  readonly timeoutMs: number;
  readonly unavailableWaitMs: number;
}

/** Where the notify pipeline sends; the URL is required, so this throws by name when it is unset. */
export function receiverConfigFromEnv(env: Environment = process.env): ReceiverConfig {
  const text = parseSection(RECEIVER_VARIABLES, env);
  return {
    url: text.PHASELINE_RECEIVER_URL.text,
    host: text.PHASELINE_RECEIVER_URL.host,
    timeoutMs: text.PHASELINE_RECEIVER_TIMEOUT_MS,
    unavailableWaitMs: text.PHASELINE_RECEIVER_WAIT_SECONDS * 1000,
  };
}

/** The search backend the configuration chose: the bundled corpus, SearXNG or Tavily. */
export type SearchConfig =
  | { readonly kind: 'corpus' }
  | { readonly kind: 'searxng'; readonly baseUrl: string; readonly timeoutMs: number }
  | { readonly kind: 'tavily'; readonly apiKey: string; readonly baseUrl: string; readonly timeoutMs: number };

export interface PageToolConfig extends PageFetchLimits {
  readonly tokenBudget: number;
  readonly artifactBytesPerJob: number;
}

/** The research tools the configuration chose: the corpus tools, or web search with fetch_page and its limits. */
export type ToolsConfig = { readonly search: { readonly kind: 'corpus' } } | { readonly search: Exclude<SearchConfig, { kind: 'corpus' }>; readonly pages: PageToolConfig };

/**
 * The research tools' settings. The backend's own variables are read only for that backend, and
 * the fetch_page settings only with a web backend (the corpus toolbox has no fetch_page).
 */
export function toolsConfigFromEnv(env: Environment = process.env): ToolsConfig {
  const { PHASELINE_SEARCH: kind, PHASELINE_SEARCH_TIMEOUT_MS: timeoutMs } = parseSection(SEARCH_VARIABLES, env);
  if (kind === 'corpus') return { search: { kind } };
  let search: Exclude<SearchConfig, { kind: 'corpus' }>;
  if (kind === 'searxng') {
    search = { kind, baseUrl: parseSection(SEARXNG_VARIABLES, env).PHASELINE_SEARXNG_URL, timeoutMs };
  } else {
    const tavily = parseSection(TAVILY_VARIABLES, env);
    search = { kind, apiKey: tavily.PHASELINE_TAVILY_API_KEY, baseUrl: tavily.PHASELINE_TAVILY_BASE_URL, timeoutMs };
  }
  const pages = parseSection(PAGE_VARIABLES, env);
  return {
    search,
    pages: {
      timeoutMs: pages.PHASELINE_FETCH_TIMEOUT_MS,
      maxBytes: pages.PHASELINE_FETCH_MAX_BYTES,
      maxRedirects: pages.PHASELINE_FETCH_MAX_REDIRECTS,
      tokenBudget: pages.PHASELINE_FETCH_TOKEN_BUDGET,
      artifactBytesPerJob: pages.PHASELINE_FETCH_MAX_BYTES_PER_JOB,
      allowedAddresses: pages.PHASELINE_FETCH_ALLOWED_ADDRESSES,
    },
  };
}

/** Whether the step function binds the Tavily key secret; like modelApiKeyNeeded, it never throws. */
export function tavilyApiKeyNeeded(env: Environment = process.env): boolean {
  try {
    return parseSection({ PHASELINE_SEARCH: SEARCH_VARIABLES.PHASELINE_SEARCH }, env).PHASELINE_SEARCH === 'tavily';
  } catch {
    return false;
  }
}

/** The default limits per user at submit, for signed-in and for anonymous accounts, and the ceiling on all anonymous accounts' jobs. */
export function quotaDefaultsFromEnv(env: Environment = process.env): QuotaDefaults {
  const text = parseSection(QUOTA_VARIABLES, env);
  return {
    signedIn: { jobsInFlight: text.PHASELINE_QUOTA_JOBS_IN_FLIGHT, submitsPerMinute: text.PHASELINE_QUOTA_SUBMITS_PER_MINUTE, spendUsdPerDay: text.PHASELINE_QUOTA_SPEND_USD_PER_DAY },
    anonymous: {
      jobsInFlight: text.PHASELINE_QUOTA_ANONYMOUS_JOBS_IN_FLIGHT,
      submitsPerMinute: text.PHASELINE_QUOTA_ANONYMOUS_SUBMITS_PER_MINUTE,
      spendUsdPerDay: text.PHASELINE_QUOTA_ANONYMOUS_SPEND_USD_PER_DAY,
    },
    anonymousJobsInFlightTotal: text.PHASELINE_QUOTA_ANONYMOUS_JOBS_IN_FLIGHT_TOTAL,
  };
}

/** Where spans go; the OTLP URL is read only for otlp, the ratio only when spans are exported. */
export function tracingConfigFromEnv(env: Environment = process.env): TracingConfig {
  const { PHASELINE_TRACE_EXPORTER: exporter } = parseSection({ PHASELINE_TRACE_EXPORTER: TRACE_VARIABLES.PHASELINE_TRACE_EXPORTER }, env);
  if (exporter === 'none') return { exporter };
  const { PHASELINE_TRACE_SAMPLE_RATIO: sampleRatio } = parseSection({ PHASELINE_TRACE_SAMPLE_RATIO: TRACE_VARIABLES.PHASELINE_TRACE_SAMPLE_RATIO }, env);
  if (exporter === 'console') return { exporter, sampleRatio };
  const { PHASELINE_TRACE_OTLP_URL: url } = parseSection({ PHASELINE_TRACE_OTLP_URL: TRACE_VARIABLES.PHASELINE_TRACE_OTLP_URL }, env);
  return { exporter, url, sampleRatio };
}
