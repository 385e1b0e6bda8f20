/**
 * The configuration module: each section parsed from the environment into typed settings, with
 * the documented defaults, and errors that name the variable and say what it must be.
 */
import {
  ConfigurationError,
  DECLARED_VARIABLES,
  engineOptionsFromEnv,
  modelApiKeyNeeded,
  providerConfigFromEnv,
  quotaDefaultsFromEnv,
  receiverConfigFromEnv,
  refuseUnpricedProvider,
  sectionPolicyFromEnv,
  stepQueueLimitsFromEnv,
  tavilyApiKeyNeeded,
  toolsConfigFromEnv,
  tracingConfigFromEnv,
} from '../../functions/src/config/environment';
import { TerminalError } from '../../functions/src/core/errors';
import { DEFAULT_ENGINE_OPTIONS, type EngineOptions } from '../../functions/src/core/options';
import { DEFAULT_OFFLINE_SETTINGS } from '../../functions/src/providers/offline/settings';

const RECEIVER = { PHASELINE_RECEIVER_URL: 'http://127.0.0.1:8787' };
const PRICES = { PHASELINE_MODEL_INPUT_USD_PER_1K: '0.15', PHASELINE_MODEL_OUTPUT_USD_PER_1K: '0.6' };

describe('defaults', () => {
  test('every declared default is what parsing an empty environment gives', () => {
    const engine = engineOptionsFromEnv({});
    const offline = providerConfigFromEnv({});
    const keyed = providerConfigFromEnv({ PHASELINE_PROVIDER: 'openai-compatible', ...PRICES });
    if (keyed.kind !== 'openai-compatible') throw new Error('expected the keyed provider');
    const receiver = receiverConfigFromEnv(RECEIVER);
    const corpus = toolsConfigFromEnv({});
    const quotas = quotaDefaultsFromEnv({});
    const traced = tracingConfigFromEnv({ PHASELINE_TRACE_EXPORTER: 'otlp' });
    if (traced.exporter !== 'otlp') throw new Error('expected otlp');
    const web = toolsConfigFromEnv({ PHASELINE_SEARCH: 'tavily', PHASELINE_TAVILY_API_KEY: 'tvly-x' });
    if (!('pages' in web) || web.search.kind !== 'tavily') throw new Error('expected the Tavily tools');
    const parsed: Record<string, string | number | undefined> = {
      PHASELINE_PROVIDER: offline.kind,
      PHASELINE_OFFLINE_SEED: offline.offline.seed,
      PHASELINE_MODEL_BASE_URL: keyed.model.baseUrl,
      PHASELINE_MODEL: keyed.model.model,
      PHASELINE_MODEL_API_KEY: keyed.model.apiKey,
      PHASELINE_MODEL_TIMEOUT_MS: keyed.model.timeoutMs,
      PHASELINE_MODEL_CONTEXT_TOKENS: keyed.model.contextWindowTokens,
      // No default: openai-compatible is refused without them (bug 30 below).
      PHASELINE_MODEL_INPUT_USD_PER_1K: undefined,
      PHASELINE_MODEL_OUTPUT_USD_PER_1K: undefined,
      PHASELINE_MAX_TOOL_CALLS_PER_ANSWER: sectionPolicyFromEnv({}).maxToolCallsPerAnswer,
      PHASELINE_RECEIVER_URL: undefined,
      PHASELINE_RECEIVER_TIMEOUT_MS: receiver.timeoutMs,
      PHASELINE_RECEIVER_WAIT_SECONDS: receiver.unavailableWaitMs / 1000,
      PHASELINE_SEARCH: corpus.search.kind,
      PHASELINE_SEARCH_TIMEOUT_MS: web.search.timeoutMs,
      PHASELINE_SEARXNG_URL: undefined,
      PHASELINE_TAVILY_API_KEY: undefined,
      PHASELINE_TAVILY_BASE_URL: web.search.baseUrl,
      PHASELINE_FETCH_TIMEOUT_MS: web.pages.timeoutMs,
      PHASELINE_FETCH_MAX_BYTES: web.pages.maxBytes,
      PHASELINE_FETCH_MAX_REDIRECTS: web.pages.maxRedirects,
      PHASELINE_FETCH_TOKEN_BUDGET: web.pages.tokenBudget,
      PHASELINE_FETCH_MAX_BYTES_PER_JOB: web.pages.artifactBytesPerJob,
      PHASELINE_FETCH_ALLOWED_ADDRESSES: web.pages.allowedAddresses.length === 0 ? undefined : web.pages.allowedAddresses.map(({ address, port }) => `${address}:${port}`).join(','),
      PHASELINE_QUOTA_JOBS_IN_FLIGHT: quotas.signedIn.jobsInFlight,
      PHASELINE_QUOTA_SUBMITS_PER_MINUTE: quotas.signedIn.submitsPerMinute,
      PHASELINE_QUOTA_ANONYMOUS_JOBS_IN_FLIGHT: quotas.anonymous.jobsInFlight,
      PHASELINE_QUOTA_ANONYMOUS_SUBMITS_PER_MINUTE: quotas.anonymous.submitsPerMinute,
      PHASELINE_QUOTA_SPEND_USD_PER_DAY: quotas.signedIn.spendUsdPerDay,
      PHASELINE_QUOTA_ANONYMOUS_SPEND_USD_PER_DAY: quotas.anonymous.spendUsdPerDay,
      PHASELINE_QUOTA_ANONYMOUS_JOBS_IN_FLIGHT_TOTAL: quotas.anonymousJobsInFlightTotal,
      PHASELINE_STEP_QUEUE_CONCURRENCY: stepQueueLimitsFromEnv({}).maxConcurrentDispatches,
      PHASELINE_STEP_QUEUE_DISPATCHES_PER_SECOND: stepQueueLimitsFromEnv({}).maxDispatchesPerSecond,
      PHASELINE_TRACE_EXPORTER: tracingConfigFromEnv({}).exporter,
      PHASELINE_TRACE_OTLP_URL: traced.url,
      PHASELINE_TRACE_SAMPLE_RATIO: traced.sampleRatio,
    };
    for (const declared of DECLARED_VARIABLES) {
      if (declared.name === 'PHASELINE_OFFLINE_SETTINGS') {
        expect(offline.offline.settings).toEqual(DEFAULT_OFFLINE_SETTINGS);
        expect(declared.defaultText).toBe('{}');
        continue;
      }
      const engineOption = Object.keys(DEFAULT_ENGINE_OPTIONS).find((option) => declared.name === `PHASELINE_${option.replace(/[A-Z]/g, (letter) => `_${letter}`).toUpperCase()}`);
      const value = engineOption === undefined ? parsed[declared.name] : engine[engineOption as keyof EngineOptions];
      expect([declared.name, value === undefined ? 'unset' : String(value)]).toEqual([declared.name, declared.defaultText]);
    }
  });

  test('the engine defaults are core/options\' own', () => {
    expect(engineOptionsFromEnv({ PATH: '/usr/bin' })).toEqual(DEFAULT_ENGINE_OPTIONS);
  });
});

describe('engine', () => {
  test('a cross-field refusal from core/options names the variables behind the options it names', () => {
    expect(() => engineOptionsFromEnv({ PHASELINE_HEARTBEAT_SECONDS: '20' })).toThrow(
      'heartbeatSeconds (20) must be shorter than leaseSeconds (20) (PHASELINE_LEASE_SECONDS unset (default 20), PHASELINE_HEARTBEAT_SECONDS=20)',
    );
    expect(() => engineOptionsFromEnv({ PHASELINE_WRITE_RETRIES: '-2' })).toThrow('Engine option writeRetries must be a non-negative number, got -2 (PHASELINE_WRITE_RETRIES=-2)');
  });

  test('every malformed variable is reported at once, each by name', () => {
    expect(() => engineOptionsFromEnv({ PHASELINE_MAX_ATTEMPTS: 'five', PHASELINE_LEASE_SECONDS: '3m' })).toThrow(
      'PHASELINE_LEASE_SECONDS must be a number, got "3m"; PHASELINE_MAX_ATTEMPTS must be a number, got "five"',
    );
    expect(() => engineOptionsFromEnv({ PHASELINE_MAX_ATTEMPTS: 'five' })).toThrow(ConfigurationError);
  });
});

describe('step queue', () => {
  test('the dispatch limits come from the environment', () => {
    expect(stepQueueLimitsFromEnv({ PHASELINE_STEP_QUEUE_CONCURRENCY: '24', PHASELINE_STEP_QUEUE_DISPATCHES_PER_SECOND: '2.5' })).toEqual({ maxConcurrentDispatches: 24, maxDispatchesPerSecond: 2.5 });
  });

  test('a concurrency that is no whole number from 1 to 5000, or a rate past 500, is refused by name', () => {
    expect(() => stepQueueLimitsFromEnv({ PHASELINE_STEP_QUEUE_CONCURRENCY: '0' })).toThrow('PHASELINE_STEP_QUEUE_CONCURRENCY must be at least 1, got "0"');
    expect(() => stepQueueLimitsFromEnv({ PHASELINE_STEP_QUEUE_CONCURRENCY: '2.5' })).toThrow('PHASELINE_STEP_QUEUE_CONCURRENCY must be an integer, got "2.5"');
    expect(() => stepQueueLimitsFromEnv({ PHASELINE_STEP_QUEUE_CONCURRENCY: '5001' })).toThrow('PHASELINE_STEP_QUEUE_CONCURRENCY must be at most 5000, got "5001"');
    expect(() => stepQueueLimitsFromEnv({ PHASELINE_STEP_QUEUE_DISPATCHES_PER_SECOND: '501' })).toThrow('PHASELINE_STEP_QUEUE_DISPATCHES_PER_SECOND must be at most 500, got "501"');
  });
});

describe('provider', () => {
  test('offline by default, with the simulator settings and seed from the environment', () => {
    const config = providerConfigFromEnv({ PHASELINE_OFFLINE_SETTINGS: ' {"latencyMs": 40} ', PHASELINE_OFFLINE_SEED: '7', PHASELINE_MODEL_TIMEOUT_MS: 'ignored offline' });
    expect(config).toEqual({ kind: 'offline', offline: { settings: { ...DEFAULT_OFFLINE_SETTINGS, latencyMs: 40 }, seed: 7 } });
  });

  test('openai-compatible reads the model settings; blank ones keep their defaults; no key means none is sent', () => {
    const config = providerConfigFromEnv({
      PHASELINE_PROVIDER: 'openai-compatible',
      PHASELINE_MODEL_BASE_URL: 'http://127.0.0.1:11434/v1',
      PHASELINE_MODEL: 'llama3',
      PHASELINE_MODEL_TIMEOUT_MS: '',
      PHASELINE_MODEL_INPUT_USD_PER_1K: '0.15',
      PHASELINE_MODEL_OUTPUT_USD_PER_1K: '0.6',
    });
    expect(config).toEqual({
      kind: 'openai-compatible',
      offline: { settings: DEFAULT_OFFLINE_SETTINGS, seed: 1 },
      model: { baseUrl: 'http://127.0.0.1:11434/v1', model: 'llama3', timeoutMs: 120_000, contextWindowTokens: 128_000, inputUsdPer1kTokens: 0.15, outputUsdPer1kTokens: 0.6 },
    });
    const keyed = providerConfigFromEnv({ PHASELINE_PROVIDER: 'openai-compatible', PHASELINE_MODEL_API_KEY: 'sk-test', ...PRICES });
    expect(keyed.kind === 'openai-compatible' && keyed.model.apiKey).toBe('sk-test');
  });

  test.each([
    [{ PHASELINE_PROVIDER: 'openai' }, 'PHASELINE_PROVIDER must be offline or openai-compatible, got "openai"'],
    [{ PHASELINE_OFFLINE_SEED: '1.5' }, 'PHASELINE_OFFLINE_SEED must be an integer, got "1.5"'],
    [{ PHASELINE_OFFLINE_SETTINGS: '{latencyMs: 40}' }, 'PHASELINE_OFFLINE_SETTINGS is not valid JSON, got "{latencyMs: 40}"'],
    [{ PHASELINE_OFFLINE_SETTINGS: '{"timeoutRate": 2, "colour": "red"}' }, 'PHASELINE_OFFLINE_SETTINGS: timeoutRate must be at most 1; PHASELINE_OFFLINE_SETTINGS has unknown fields colour, got'],
    [{ PHASELINE_PROVIDER: 'openai-compatible', PHASELINE_MODEL_BASE_URL: 'ftp://models.example' }, 'PHASELINE_MODEL_BASE_URL must be an http(s) URL, got "ftp://models.example"'],
    [{ PHASELINE_PROVIDER: 'openai-compatible', PHASELINE_MODEL_TIMEOUT_MS: '0' }, 'PHASELINE_MODEL_TIMEOUT_MS must be at least 1, got "0"'],
    [{ PHASELINE_PROVIDER: 'openai-compatible', PHASELINE_MODEL_CONTEXT_TOKENS: '128k' }, 'PHASELINE_MODEL_CONTEXT_TOKENS must be a number, got "128k"'],
    [{ PHASELINE_PROVIDER: 'openai-compatible', PHASELINE_MODEL_OUTPUT_USD_PER_1K: '-1' }, 'PHASELINE_MODEL_OUTPUT_USD_PER_1K must be at least 0, got "-1"'],
  ])('%j is refused for good, by name', (env, message) => {
    expect(() => providerConfigFromEnv(env)).toThrow(message);
    expect(() => providerConfigFromEnv(env)).toThrow(TerminalError);
  });

  test('a long value is echoed cut short', () => {
    const long = `{${'x'.repeat(200)}`;
    expect(() => providerConfigFromEnv({ PHASELINE_OFFLINE_SETTINGS: long })).toThrow(`got "${long.slice(0, 80)}…"`);
  });

  test('the API key secret is bound only for the keyed provider, and a malformed kind does not stop the functions loading', () => {
    expect(modelApiKeyNeeded({})).toBe(false);
    expect(modelApiKeyNeeded({ PHASELINE_PROVIDER: ' openai-compatible ' })).toBe(true);
    expect(modelApiKeyNeeded({ PHASELINE_PROVIDER: 'opneai' })).toBe(false);
  });

  test('bug 30: openai-compatible without its prices is refused, naming each price that is unset; the offline simulator needs none', () => {
    const refusal = (env: Record<string, string>): unknown => {
      try {
        providerConfigFromEnv(env);
      } catch (error) {
        return error;
      }
      return null;
    };
    const bothUnset = refusal({ PHASELINE_PROVIDER: 'openai-compatible' });
    expect(bothUnset).toBeInstanceOf(ConfigurationError);
    expect((bothUnset as Error).message).toMatch(/^PHASELINE_MODEL_INPUT_USD_PER_1K and PHASELINE_MODEL_OUTPUT_USD_PER_1K are not set: /);
    expect((bothUnset as Error).message).toMatch(/daily spend limit/);
    expect((refusal({ PHASELINE_PROVIDER: 'openai-compatible', PHASELINE_MODEL_INPUT_USD_PER_1K: '0.15', PHASELINE_MODEL_OUTPUT_USD_PER_1K: ' ' }) as Error).message).toMatch(
      /^PHASELINE_MODEL_OUTPUT_USD_PER_1K is not set: /,
    );
    expect(refusal({})).toBeNull();
    expect(refusal({ PHASELINE_PROVIDER: 'offline' })).toBeNull();
  });

  test('bug 30: prices set, 0 included (an endpoint that costs nothing, said so on purpose), are accepted', () => {
    const free = providerConfigFromEnv({ PHASELINE_PROVIDER: 'openai-compatible', PHASELINE_MODEL_INPUT_USD_PER_1K: '0', PHASELINE_MODEL_OUTPUT_USD_PER_1K: '0' });
    expect(free.kind === 'openai-compatible' && [free.model.inputUsdPer1kTokens, free.model.outputUsdPer1kTokens]).toEqual([0, 0]);
  });

  test('bug 30: the functions refuse to load (so a deploy stops) with an unpriced openai-compatible provider, naming the variables', () => {
    expect(() => refuseUnpricedProvider({ PHASELINE_PROVIDER: 'openai-compatible' })).toThrow(/^PHASELINE_MODEL_INPUT_USD_PER_1K and PHASELINE_MODEL_OUTPUT_USD_PER_1K are not set/);
    for (const env of [{}, { PHASELINE_PROVIDER: 'opneai' }, { PHASELINE_PROVIDER: 'openai-compatible', ...PRICES }]) expect(() => refuseUnpricedProvider(env)).not.toThrow();
    const saved = process.env.PHASELINE_PROVIDER;
    process.env.PHASELINE_PROVIDER = 'openai-compatible';
    try {
      jest.isolateModules(() => {
        // eslint-disable-next-line @typescript-eslint/no-require-imports -- loaded as the functions emulator and deploy load it, with this environment
        expect(() => require('../../functions/src/index') as unknown).toThrow(/PHASELINE_MODEL_INPUT_USD_PER_1K and PHASELINE_MODEL_OUTPUT_USD_PER_1K are not set/);
      });
    } finally {
      if (saved === undefined) delete process.env.PHASELINE_PROVIDER;
      else process.env.PHASELINE_PROVIDER = saved;
    }
  });
});

describe('receiver', () => {
  test('the URL as configured (trimmed), its host, and the waits', () => {
    expect(receiverConfigFromEnv({ PHASELINE_RECEIVER_URL: ' https://receiver.example:8443/base ', PHASELINE_RECEIVER_TIMEOUT_MS: '2500', PHASELINE_RECEIVER_WAIT_SECONDS: '4' })).toEqual({
      url: 'https://receiver.example:8443/base',
      host: 'receiver.example:8443',
      timeoutMs: 2_500,
      unavailableWaitMs: 4_000,
    });
  });

  test.each([
    [{}, 'PHASELINE_RECEIVER_URL is not set: the notify pipeline has no receiver to send through'],
    [{ PHASELINE_RECEIVER_URL: 'not a url' }, 'PHASELINE_RECEIVER_URL is not a URL, got "not a url"'],
    [{ ...RECEIVER, PHASELINE_RECEIVER_WAIT_SECONDS: '0' }, 'PHASELINE_RECEIVER_WAIT_SECONDS must be a positive number, got "0"'],
  ])('%j is refused by name', (env, message) => {
    expect(() => receiverConfigFromEnv(env)).toThrow(message);
  });
});

describe('agent sections', () => {
  test('bug 37: the tool calls one answer may have run, from the environment, and refused by name when not a positive whole number', () => {
    expect(sectionPolicyFromEnv({})).toEqual({ maxToolCallsPerAnswer: 8 });
    expect(sectionPolicyFromEnv({ PHASELINE_MAX_TOOL_CALLS_PER_ANSWER: ' 3 ' })).toEqual({ maxToolCallsPerAnswer: 3 });
    expect(() => sectionPolicyFromEnv({ PHASELINE_MAX_TOOL_CALLS_PER_ANSWER: '0' })).toThrow('PHASELINE_MAX_TOOL_CALLS_PER_ANSWER must be at least 1, got "0"');
    expect(() => sectionPolicyFromEnv({ PHASELINE_MAX_TOOL_CALLS_PER_ANSWER: 'many' })).toThrow(TerminalError);
  });
});

describe('research tools', () => {
  const PAGES = { timeoutMs: 15_000, maxBytes: 2_000_000, maxRedirects: 5, tokenBudget: 4_000, artifactBytesPerJob: 20_000_000, allowedAddresses: [] };

  test('the corpus by default, and no web setting is read for it', () => {
    expect(toolsConfigFromEnv({ PHASELINE_SEARXNG_URL: 'not a url', PHASELINE_FETCH_MAX_BYTES: 'lots' })).toEqual({ search: { kind: 'corpus' } });
  });

  test('SearXNG with its URL and the fetch settings', () => {
    expect(
      toolsConfigFromEnv({
        PHASELINE_SEARCH: ' searxng ',
        PHASELINE_SEARXNG_URL: 'http://searxng.internal:8080/',
        PHASELINE_SEARCH_TIMEOUT_MS: '2500',
        PHASELINE_FETCH_MAX_BYTES: '20000',
        PHASELINE_FETCH_MAX_REDIRECTS: '0',
        PHASELINE_FETCH_ALLOWED_ADDRESSES: ' 127.0.0.1:8080, [::1]:8080 ,10.20.0.0/16:443,, [fd00::/8]:80 ',
      }),
    ).toEqual({
      search: { kind: 'searxng', baseUrl: 'http://searxng.internal:8080/', timeoutMs: 2_500 },
      pages: {
        ...PAGES,
        maxBytes: 20_000,
        maxRedirects: 0,
        allowedAddresses: [
          { address: '127.0.0.1', port: 8080 },
          { address: '::1', port: 8080 },
          { address: '10.20.0.0/16', port: 443 },
          { address: 'fd00::/8', port: 80 },
        ],
      },
    });
  });

  test('Tavily with its key and the public endpoint unless another is set', () => {
    expect(toolsConfigFromEnv({ PHASELINE_SEARCH: 'tavily', PHASELINE_TAVILY_API_KEY: 'tvly-abc' })).toEqual({
      search: { kind: 'tavily', apiKey: 'tvly-abc', baseUrl: 'https://api.tavily.com', timeoutMs: 15_000 },
      pages: PAGES,
    });
  });

  test.each([
    [{ PHASELINE_SEARCH: 'google' }, 'PHASELINE_SEARCH must be corpus, searxng, tavily, got "google"'],
    [{ PHASELINE_SEARCH: 'searxng' }, 'PHASELINE_SEARXNG_URL is not set: PHASELINE_SEARCH=searxng needs the base URL of the SearXNG instance'],
    [{ PHASELINE_SEARCH: 'searxng', PHASELINE_SEARXNG_URL: 'searxng:8080' }, 'PHASELINE_SEARXNG_URL must be an http(s) URL, got "searxng:8080"'],
    [{ PHASELINE_SEARCH: 'tavily', PHASELINE_TAVILY_API_KEY: ' ' }, 'PHASELINE_TAVILY_API_KEY is not set: PHASELINE_SEARCH=tavily needs an API key'],
    [{ PHASELINE_SEARCH: 'tavily', PHASELINE_TAVILY_API_KEY: 'k', PHASELINE_TAVILY_BASE_URL: 'ftp://tavily' }, 'PHASELINE_TAVILY_BASE_URL must be an http(s) URL, got "ftp://tavily"'],
    [{ PHASELINE_SEARCH: 'searxng', PHASELINE_SEARXNG_URL: 'http://s', PHASELINE_FETCH_TIMEOUT_MS: '0' }, 'PHASELINE_FETCH_TIMEOUT_MS must be at least 1, got "0"'],
    [{ PHASELINE_SEARCH: 'searxng', PHASELINE_SEARXNG_URL: 'http://s', PHASELINE_FETCH_MAX_BYTES: '5MB' }, 'PHASELINE_FETCH_MAX_BYTES must be a number, got "5MB"'],
    [{ PHASELINE_SEARCH: 'searxng', PHASELINE_SEARXNG_URL: 'http://s', PHASELINE_FETCH_MAX_REDIRECTS: '1.5' }, 'PHASELINE_FETCH_MAX_REDIRECTS must be an integer, got "1.5"'],
    [{ PHASELINE_SEARCH: 'searxng', PHASELINE_SEARXNG_URL: 'http://s', PHASELINE_FETCH_TOKEN_BUDGET: '10' }, 'PHASELINE_FETCH_TOKEN_BUDGET must be at least 100, got "10"'],
    [
      { PHASELINE_SEARCH: 'searxng', PHASELINE_SEARXNG_URL: 'http://s', PHASELINE_FETCH_ALLOWED_ADDRESSES: '127.0.0.1:80, localhost:80, 10.0.0.0/33:80, 127.0.0.1:0, ::1:80' },
      'PHASELINE_FETCH_ALLOWED_ADDRESSES must list address:port entries separated by commas (an IP address or CIDR range and the one port it may be reached on, e.g. 127.0.0.1:8080, [::1]:8080, 10.20.0.0/16:443); an address without a port would open all its ports; not "localhost:80", "10.0.0.0/33:80", "127.0.0.1:0", "::1:80", got "127.0.0.1:80, localhost:80, 10.0.0.0/33:80, 127.0.0.1:0, ::1:80"',
    ],
  ])('%j is refused for good, by name', (env, message) => {
    expect(() => toolsConfigFromEnv(env)).toThrow(message);
    expect(() => toolsConfigFromEnv(env)).toThrow(TerminalError);
  });

  test('bug 33: an allow-list entry without a port is refused by name, never read as every port of the address', () => {
    for (const entry of ['127.0.0.1', '127.0.0.0/8', '[::1]']) {
      const env = { PHASELINE_SEARCH: 'searxng', PHASELINE_SEARXNG_URL: 'http://s', PHASELINE_FETCH_ALLOWED_ADDRESSES: `${entry}, [::1]:9099` };
      expect(() => toolsConfigFromEnv(env)).toThrow(
        'PHASELINE_FETCH_ALLOWED_ADDRESSES must list address:port entries separated by commas (an IP address or CIDR range and the one port it may be reached on, e.g. 127.0.0.1:8080, [::1]:8080, 10.20.0.0/16:443); ' +
          `an address without a port would open all its ports; not ${JSON.stringify(entry)}, got ${JSON.stringify(`${entry}, [::1]:9099`)}`,
      );
      expect(() => toolsConfigFromEnv(env)).toThrow(TerminalError);
    }
  });

  test('the Tavily key is never echoed', () => {
    const env = { PHASELINE_SEARCH: 'tavily', PHASELINE_TAVILY_API_KEY: 'tvly-secret', PHASELINE_TAVILY_BASE_URL: 'nope' };
    expect(() => toolsConfigFromEnv(env)).toThrow('PHASELINE_TAVILY_BASE_URL must be an http(s) URL, got "nope"');
    let message = '';
    try {
      toolsConfigFromEnv({ ...env, PHASELINE_TAVILY_API_KEY: '', PHASELINE_TAVILY_BASE_URL: '' });
    } catch (error) {
      message = (error as Error).message;
    }
    expect(message).toBe('PHASELINE_TAVILY_API_KEY is not set: PHASELINE_SEARCH=tavily needs an API key');
  });

  test('the Tavily key secret is bound only for Tavily, and a malformed setting does not stop the functions loading', () => {
    expect(tavilyApiKeyNeeded({})).toBe(false);
    expect(tavilyApiKeyNeeded({ PHASELINE_SEARCH: 'tavily', PHASELINE_SEARCH_TIMEOUT_MS: 'soon' })).toBe(true);
    expect(tavilyApiKeyNeeded({ PHASELINE_SEARCH: 'searxng' })).toBe(false);
    expect(tavilyApiKeyNeeded({ PHASELINE_SEARCH: 'tavly' })).toBe(false);
  });
});
