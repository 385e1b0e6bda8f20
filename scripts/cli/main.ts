/**
 * `phaseline`: the command-line entry point (run through tsx by phaseline.mjs). `run` is the whole
 * program apart from the process: tests call it with their own Io and environment.
 */
import { quotaDefaultsFromEnv } from '../../functions/src/config/environment';
import { adminCommand } from './admin-commands';
import { parseInvocation, USAGE } from './args';
import { CliError, EXIT } from './errors';
import { terminalText } from './format';
import { processIo, type Io } from './io';
import { limits, listAll, openOperatorContext, redrive, release, sweep } from './operator-commands';
import { queueCommand } from './queue-commands';
import { resolveTarget } from './target';
import { cancel, decide, listOwn, submit, userContext, watch } from './user-commands';

function escapedLines(text: string): string {
  return text.split('\n').map(terminalText).join('\n');
}

/** Runs a command and turns its failure into a message on stderr and an exit status. */
export async function guarded(io: Io, body: () => Promise<number>): Promise<number> {
  try {
    return await body();
  } catch (error) {
    io.endStatus();
    // Messages can quote stored text (a refusal naming who cancelled a job, a server's answer): shown with control characters escaped, line by line.
    if (error instanceof CliError) {
      io.err(`phaseline: ${escapedLines(error.message)}`);
      if (error.exitCode === EXIT.usage) io.err('Run `phaseline --help` for usage.');
      return error.exitCode;
    }
    io.err(`phaseline: unexpected error: ${escapedLines(error instanceof Error ? (error.stack ?? error.message) : String(error))}`);
    return EXIT.failure;
  }
}

export function run(argv: readonly string[], io: Io, env: NodeJS.ProcessEnv): Promise<number> {
  return guarded(io, async () => {
    const { global, command } = parseInvocation(argv);
    if (command.name === 'help') {
      io.out(USAGE);
      return EXIT.ok;
    }
    const target = resolveTarget(global, env);
    if (command.name === 'queue') return await queueCommand(target, io, command);
    if (command.name === 'admin') return await adminCommand(target, io, command);
    if (command.name === 'release' || command.name === 'redrive' || command.name === 'sweep' || command.name === 'limits' || (command.name === 'list' && command.all)) {
      const ctx = await openOperatorContext(target, io, env);
      try {
        if (command.name === 'release') return await release(ctx, command);
        if (command.name === 'redrive') return await redrive(ctx, command);
        if (command.name === 'limits') return await limits(ctx, command, quotaDefaultsFromEnv(env));
        if (command.name === 'sweep') return await sweep(ctx);
        return await listAll(ctx, command);
      } finally {
        await ctx.close();
      }
    }
    const ctx = userContext(target, io, env);
    switch (command.name) {
      case 'submit':
        return await submit(ctx, command);
      case 'watch':
        return await watch(ctx, command);
      case 'list':
        return await listOwn(ctx, command);
      case 'cancel':
        return await cancel(ctx, command);
      case 'decide':
        return await decide(ctx, command);
    }
  });
}

if (require.main === module) {
  void run(process.argv.slice(2), processIo(), process.env).then((code) => {
    process.exitCode = code;
  });
}
