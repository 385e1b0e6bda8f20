/** The soak's command line (see scripts/chaos.ts). */
import type { ChaosOptions } from './run';

export const USAGE = 'usage: npm run chaos -- [--jobs N] [--seed S] [--concurrency C] [--time-limit SECONDS] [--fault-window SECONDS] [--quiet]';

export function parseChaosArgs(argv: readonly string[]): ChaosOptions | { readonly help: true } {
  const values = new Map<string, string>();
  let quiet = false;
  for (let index = 0; index < argv.length; index += 1) {
    const arg = argv[index] ?? '';
    if (arg === '--help' || arg === '-h') return { help: true };
    if (arg === '--quiet') {
      quiet = true;
      continue;
    }
    const [flag = '', inline] = arg.split('=', 2);
    if (!['--jobs', '--seed', '--concurrency', '--time-limit', '--fault-window'].includes(flag)) throw new Error(`unknown argument ${arg}\n${USAGE}`);
    const value = inline ?? argv[(index += 1)];
    if (value === undefined || value === '') throw new Error(`${flag} needs a value\n${USAGE}`);
    values.set(flag, value);
  }
  const positive = (flag: string, integer: boolean): number | undefined => {
    const raw = values.get(flag);
    if (raw === undefined) return undefined;
    const value = Number(raw);
    if (!Number.isFinite(value) || value <= 0 || (integer && !Number.isInteger(value))) throw new Error(`${flag} must be a positive ${integer ? 'integer' : 'number'}, got ${raw}`);
    return value;
  };
  const concurrency = positive('--concurrency', true);
  const timeLimitSeconds = positive('--time-limit', false);
  const faultWindowSeconds = positive('--fault-window', false);
  const seed = values.get('--seed') ?? String(Math.floor(Math.random() * 1_000_000));
  if (!/^[A-Za-z0-9_-]{1,40}$/.test(seed)) throw new Error(`--seed must be 1-40 letters, digits, - or _, got ${seed}`);
  return {
    jobs: positive('--jobs', true) ?? 20,
    seed,
    verbose: !quiet,
    ...(concurrency === undefined ? {} : { concurrency }),
    ...(timeLimitSeconds === undefined ? {} : { timeLimitSeconds }),
    ...(faultWindowSeconds === undefined ? {} : { faultWindowSeconds }),
  };
}
