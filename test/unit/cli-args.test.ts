import { PIPELINE_GRANTS_CLAIM } from '../../functions/src/core/pipeline';
import { claimsWithPipeline } from '../../scripts/cli/admin-commands';
import { DEFAULT_LIST_LIMIT, parseInvocation, USAGE } from '../../scripts/cli/args';
import { EXIT, UsageError } from '../../scripts/cli/errors';
import { bufferedIo } from '../../scripts/cli/io';
import { run } from '../../scripts/cli/main';

const command = (...argv: string[]) => parseInvocation(argv).command;

function usageError(argv: string[]): UsageError {
  try {
    parseInvocation(argv);
  } catch (error) {
    if (error instanceof UsageError) return error;
    throw error;
  }
  throw new Error(`parsed without an error: ${argv.join(' ')}`);
}

describe('help', () => {
  test.each([[[]], [['--help']], [['-h']], [['help']], [['watch', '--help']], [['--project', 'demo-x', 'help']]])('%j asks for help', (argv) => {
    expect(command(...argv)).toEqual({ name: 'help' });
  });

  test('run prints the usage and exits 0', async () => {
    const io = bufferedIo();
    expect(await run(['--help'], io, {})).toBe(EXIT.ok);
    expect(io.stdout).toEqual([USAGE]);
  });

  test('the usage names every command and says where sweep runs', () => {
    for (const name of ['submit', 'watch', 'list', 'cancel', 'decide', 'release', 'sweep', 'queue stats', 'queue pause']) expect(USAGE).toContain(`  ${name}`);
    expect(USAGE).toContain('runs the project\'s sweep() in\n  this process');
  });
});

describe('submit', () => {
  test('--question is the research shortcut', () => {
    expect(command('submit', '--question', 'What limits battery life?')).toEqual({
      name: 'submit',
      pipeline: 'research',
      source: { kind: 'json', input: { question: 'What limits battery life?' } },
      watch: false,
    });
  });

  test('a pipeline with its JSON input, and the options', () => {
    expect(command('submit', 'canary', '{"text":"a\\n\\nb"}', '--conversation', 'c1', '--idempotency-key', 'k-1', '--watch')).toEqual({
      name: 'submit',
      pipeline: 'canary',
      source: { kind: 'json', input: { text: 'a\n\nb' } },
      conversationId: 'c1',
      idempotencyKey: 'k-1',
      watch: true,
    });
  });

  test('the input from a file is read later, by the command', () => {
    expect(command('submit', 'research', '--input-file', 'question.json')).toMatchObject({ source: { kind: 'file', path: 'question.json' } });
  });

  test.each([
    [['submit'], /needs a pipeline and its input, or --question/],
    [['submit', 'research'], /needs the input as JSON/],
    [['submit', 'research', '{"question": '], /The input argument is not valid JSON/],
    [['submit', 'research', '{}', '--question', 'why?'], /either --question or a pipeline/],
    [['submit', 'research', '{}', '--input-file', 'x.json'], /either as an argument or with --input-file/],
    [['submit', 'research', '{}', 'extra'], /unexpected arguments: "extra"/],
    [['submit', '--question'], /argument missing/],
  ])('%j is refused', (argv, message) => {
    expect(usageError(argv).message).toMatch(message);
  });
});

describe('job commands', () => {
  test('watch, cancel, decide, release take the job ID', () => {
    expect(command('watch', 'abcDEF_12-3', '--report')).toEqual({ name: 'watch', jobId: 'abcDEF_12-3', report: true });
    expect(command('cancel', 'j1')).toEqual({ name: 'cancel', jobId: 'j1' });
    expect(command('cancel', 'j1', '--reason', 'no longer needed')).toEqual({ name: 'cancel', jobId: 'j1', reason: 'no longer needed' });
    expect(command('decide', 'j1', 'scope', 'three sections')).toEqual({ name: 'decide', jobId: 'j1', questionId: 'scope', answer: 'three sections' });
    expect(command('release', 'j1')).toEqual({ name: 'release', jobId: 'j1' });
  });

  test.each([
    [['watch'], /watch needs a job ID/],
    [['watch', 'jobs/j1'], /"jobs\/j1" is not a job ID/],
    [['cancel', 'j1', '--reason', ' '], /--reason must not be empty/],
    [['decide', 'j1', 'scope'], /decide needs a job ID, a question ID and an answer/],
    [['decide', 'j1', 'scope', 'one', 'two'], /unexpected arguments: "two"/],
    [['release'], /release needs a job ID/],
    [['watch', 'j1', '--follow'], /Unknown option '--follow'/],
  ])('%j is refused', (argv, message) => {
    expect(usageError(argv).message).toMatch(message);
  });

  test('a job ID longer than 128 characters is refused', () => {
    expect(command('cancel', 'a'.repeat(128))).toMatchObject({ jobId: 'a'.repeat(128) });
    expect(usageError(['cancel', 'a'.repeat(129)]).message).toMatch(/is not a job ID/);
  });
});

describe('list, sweep, queue', () => {
  test('list is the user\'s, --all every user\'s, with a limit', () => {
    expect(command('list')).toEqual({ name: 'list', all: false, limit: DEFAULT_LIST_LIMIT });
    expect(command('list', '--all', '--limit', '5')).toEqual({ name: 'list', all: true, limit: 5 });
    expect(command('list', '-a', '-n', '500')).toEqual({ name: 'list', all: true, limit: 500 });
  });

  test.each([['0'], ['501'], ['ten'], ['2.5']])('--limit %s is refused', (limit) => {
    expect(usageError(['list', '--limit', limit]).message).toMatch(/--limit must be a whole number from 1 to 500/);
  });

  test('sweep and the queue actions', () => {
    expect(command('sweep')).toEqual({ name: 'sweep' });
    expect(command('queue', 'stats')).toEqual({ name: 'queue', action: 'stats' });
    expect(command('queue', 'pause')).toEqual({ name: 'queue', action: 'pause' });
    expect(command('queue', 'resume')).toEqual({ name: 'queue', action: 'resume' });
  });

  test.each([[['queue']], [['queue', 'purge']], [['sweep', 'now']]])('%j is refused', (argv) => {
    expect(usageError(argv).exitCode).toBe(EXIT.usage);
  });
});

describe('global options and mistakes', () => {
  test('--project and --region go before or after the command', () => {
    expect(parseInvocation(['--project', 'demo-x', 'list'])).toEqual({ global: { project: 'demo-x' }, command: { name: 'list', all: false, limit: DEFAULT_LIST_LIMIT } });
    expect(parseInvocation(['--region=europe-west1', 'watch', 'j1', '--project=my-app']).global).toEqual({ region: 'europe-west1', project: 'my-app' });
  });

  test('an unknown command names the commands', () => {
    expect(usageError(['status']).message).toBe('Unknown command "status". Commands: submit, watch, list, cancel, decide, release, sweep, limits, queue (phaseline --help).');
  });

  test('run reports a usage error on stderr with exit 2 and a pointer to --help', async () => {
    const io = bufferedIo();
    expect(await run(['watch'], io, {})).toBe(EXIT.usage);
    expect(io.stdout).toEqual([]);
    expect(io.stderr).toEqual(['phaseline: watch needs a job ID: phaseline watch <jobId>', 'Run `phaseline --help` for usage.']);
  });
});

describe('admin', () => {
  test('grant and revoke take a user ID; allow and disallow a user ID and a pipeline', () => {
    expect(command('admin', 'grant', 'u-1')).toEqual({ name: 'admin', action: 'grant', uid: 'u-1' });
    expect(command('admin', 'allow', 'u-1', 'notify')).toEqual({ name: 'admin', action: 'allow', uid: 'u-1', pipeline: 'notify' });
    expect(command('admin', 'disallow', 'u-1', 'notify')).toEqual({ name: 'admin', action: 'disallow', uid: 'u-1', pipeline: 'notify' });
    expect(USAGE).toContain('  admin allow <uid> <pipeline>');
  });

  test.each([
    [['admin', 'allow', 'u-1'], /needs a pipeline after the user ID/],
    [['admin', 'allow', 'u-1', 'Notify!'], /is not a pipeline name/],
    [['admin', 'grant', 'u-1', 'notify'], /unexpected arguments: "notify"/],
    [['admin', 'promote', 'u-1'], /admin needs grant or revoke and a user ID, or allow or disallow, a user ID and a pipeline/],
  ])('%j is a usage error', (argv, message) => {
    expect(usageError(argv).message).toMatch(message);
  });

  test('allow adds the pipeline to the grants claim, keeping the other claims; disallow takes it out, dropping an empty claim', () => {
    expect(claimsWithPipeline({ admin: true }, 'notify', true)).toEqual({ admin: true, [PIPELINE_GRANTS_CLAIM]: ['notify'] });
    expect(claimsWithPipeline({ [PIPELINE_GRANTS_CLAIM]: ['research'] }, 'notify', true)).toEqual({ [PIPELINE_GRANTS_CLAIM]: ['notify', 'research'] });
    expect(claimsWithPipeline({ admin: true, [PIPELINE_GRANTS_CLAIM]: ['notify'] }, 'notify', false)).toEqual({ admin: true });
    expect(claimsWithPipeline({ [PIPELINE_GRANTS_CLAIM]: ['notify'] }, 'notify', false)).toBeNull();
  });
});
