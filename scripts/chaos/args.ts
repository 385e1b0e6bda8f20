/** The chaos tool's command line (see scripts/chaos.ts): the soak, or the kill-all-once check. */
import { DEFAULT_ALLOWANCE_SECONDS, DEFAULT_KILL_ALL_LATENCY_MS, KILL_ALL_ENGINE_ENV, type KillAllOptions } from './kill-all';
import type { ChaosOptions } from './run';

export const USAGE = [
  'usage: npm run chaos -- [--jobs N] [--seed S] [--concurrency C] [--time-limit SECONDS] [--fault-window SECONDS] [--fault-gap SECONDS] [--weight KIND=N ...] [--keep DIR] [--quiet]',
  '       npm run chaos -- --kill-all-once [--seed S] [--latency-ms MS] [--engine-defaults] [--heartbeat-seconds S] [--stale-heartbeat-seconds S] [--allowance-seconds S] [--no-warm-up]',
].join('\n');

export type ChaosCommand = { readonly mode: 'soak'; readonly options: ChaosOptions } | { readonly mode: 'kill-all-once'; readonly options: KillAllOptions } | { readonly help: true };

/** `--flag value` and `--flag=value` pairs among `valued` (the last of a repeated flag in `values`, all in `repeated`), and the bare switches among `switches`. */
function readFlags(argv: readonly string[], valued: readonly string[], switches: readonly string[]): { values: Map<string, string>; repeated: Map<string, string[]>; set: Set<string> } | { help: true } {
  const values = new Map<string, string>();
  const repeated = new Map<string, string[]>();
  const set = new Set<string>();
  for (let index = 0; index < argv.length; index += 1) {
    const arg = argv[index] ?? '';
    if (arg === '--help' || arg === '-h') return { help: true };
    if (switches.includes(arg)) {
      set.add(arg);
      continue;
    }
    const equals = arg.indexOf('=');
    const [flag, inline] = equals < 0 ? [arg, undefined] : [arg.slice(0, equals), arg.slice(equals + 1)];
    if (!valued.includes(flag)) throw new Error(`unknown argument ${arg}\n${USAGE}`);
    const value = inline ?? argv[(index += 1)];
    if (value === undefined || value === '') throw new Error(`${flag} needs a value\n${USAGE}`);
    values.set(flag, value);
    repeated.set(flag, [...(repeated.get(flag) ?? []), value]);
  }
  return { values, repeated, set };
}

function positive(values: ReadonlyMap<string, string>, flag: string, integer: boolean): number | undefined {
  const raw = values.get(flag);
  if (raw === undefined) return undefined;
  const value = Number(raw);
  if (!Number.isFinite(value) || value <= 0 || (integer && !Number.isInteger(value))) throw new Error(`${flag} must be a positive ${integer ? 'integer' : 'number'}, got ${raw}`);
  return value;
}

function seedOf(values: ReadonlyMap<string, string>): string {
  const seed = values.get('--seed') ?? String(Math.floor(Math.random() * 1_000_000));
  if (!/^[A-Za-z0-9_-]{1,40}$/.test(seed)) throw new Error(`--seed must be 1-40 letters, digits, - or _, got ${seed}`);
  return seed;
}

/** The soak's options. */
export function parseChaosArgs(argv: readonly string[]): ChaosOptions | { readonly help: true } {
  const flags = readFlags(argv, ['--jobs', '--seed', '--concurrency', '--time-limit', '--fault-window', '--fault-gap', '--weight', '--keep'], ['--quiet']);
  if ('help' in flags) return flags;
  const { values, repeated, set } = flags;
  const faultWeights = weightsOf(repeated.get('--weight') ?? []);
  const concurrency = positive(values, '--concurrency', true);
  const timeLimitSeconds = positive(values, '--time-limit', false);
  const faultWindowSeconds = positive(values, '--fault-window', false);
  const faultGapSeconds = positive(values, '--fault-gap', false);
  const seed = seedOf(values);
  const keepDir = values.get('--keep');
  return {
    jobs: positive(values, '--jobs', true) ?? 20,
    seed,
    verbose: !set.has('--quiet'),
    ...(concurrency === undefined ? {} : { concurrency }),
    ...(timeLimitSeconds === undefined ? {} : { timeLimitSeconds }),
    ...(faultWindowSeconds === undefined ? {} : { faultWindowSeconds }),
    ...(faultGapSeconds === undefined ? {} : { faultGapSeconds }),
    ...(faultWeights === undefined ? {} : { faultWeights }),
    ...(keepDir === undefined ? {} : { keepDir }),
  };
}

/** `--weight kind=N` (repeatable): that injected kind's weight after the first round (planRun checks the kinds). */
function weightsOf(pairs: readonly string[]): Record<string, number> | undefined {
  if (pairs.length === 0) return undefined;
  const weights: Record<string, number> = {};
  for (const pair of pairs) {
    const [kind = '', raw = ''] = pair.split('=', 2);
    const weight = Number(raw);
    if (kind === '' || raw === '' || !Number.isFinite(weight) || weight < 0) throw new Error(`--weight wants KIND=N with N a number at least 0, got ${pair}`);
    weights[kind] = weight;
  }
  return weights;
}

/** The kill-all-once check's options (`--kill-all-once` itself included). */
export function parseKillAllArgs(argv: readonly string[]): KillAllOptions | { readonly help: true } {
  const flags = readFlags(argv, ['--seed', '--latency-ms', '--heartbeat-seconds', '--stale-heartbeat-seconds', '--allowance-seconds'], ['--kill-all-once', '--engine-defaults', '--no-warm-up']);
  if ('help' in flags) return flags;
  const { values, set } = flags;
  const heartbeatSeconds = positive(values, '--heartbeat-seconds', false);
  const staleHeartbeatSeconds = positive(values, '--stale-heartbeat-seconds', false);
  const seed = seedOf(values);
  // The check's shortened heartbeat and threshold (see KILL_ALL_ENGINE_ENV), or every engine default; a flag wins over either.
  const engineEnv: Record<string, string> = set.has('--engine-defaults') ? {} : { ...KILL_ALL_ENGINE_ENV };
  if (heartbeatSeconds !== undefined) engineEnv.PHASELINE_HEARTBEAT_SECONDS = String(heartbeatSeconds);
  if (staleHeartbeatSeconds !== undefined) engineEnv.PHASELINE_STALE_HEARTBEAT_SECONDS = String(staleHeartbeatSeconds);
  return {
    seed,
    latencyMs: positive(values, '--latency-ms', true) ?? DEFAULT_KILL_ALL_LATENCY_MS,
    allowanceSeconds: positive(values, '--allowance-seconds', false) ?? DEFAULT_ALLOWANCE_SECONDS,
    warmUp: !set.has('--no-warm-up'),
    engineEnv,
  };
}

/** Which mode the command line asks for, with its options. */
export function parseChaosCommand(argv: readonly string[]): ChaosCommand {
  if (argv.includes('--kill-all-once')) {
    const options = parseKillAllArgs(argv);
    return 'help' in options ? options : { mode: 'kill-all-once', options };
  }
  const options = parseChaosArgs(argv);
  return 'help' in options ? options : { mode: 'soak', options };
}
