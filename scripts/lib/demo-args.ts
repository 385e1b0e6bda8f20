/**
 * `npm run demo`'s command line: options, and the words of the question (joined with spaces). Anything that
 * looks like an option but is not one is refused rather than asked as a question, so a typo such
 * as `--wbe` does not quietly run the offline demo on the question "--wbe"; `--` ends the options
 * for a question that starts with a dash.
 */

export const DEMO_USAGE = [
  'Usage: npm run demo -- [--web] [--] ["Your question"]',
  '',
  '  --web    search and read web pages served by a local SearXNG-shaped server (scripts/web-fixtures/)',
  '           instead of the bundled corpus; the report cites those pages',
  '  --help   this text',
].join('\n');

export interface DemoArguments {
  readonly web: boolean;
  readonly help: boolean;
  /** Null: the demo's default question. */
  readonly question: string | null;
}

export class DemoUsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'DemoUsageError';
  }
}

export function parseDemoArguments(args: readonly string[]): DemoArguments {
  let web = false;
  let help = false;
  const words: string[] = [];
  let optionsEnded = false;
  for (const arg of args) {
    if (optionsEnded || !arg.startsWith('-') || arg === '-') {
      words.push(arg);
      continue;
    }
    if (arg === '--') optionsEnded = true;
    else if (arg === '--web') web = true;
    else if (arg === '--help' || arg === '-h') help = true;
    else throw new DemoUsageError(`Unknown option ${arg}. To ask a question that starts with a dash, put -- before it.`);
  }
  const question = words.join(' ').trim();
  return { web, help, question: question === '' ? null : question };
}
