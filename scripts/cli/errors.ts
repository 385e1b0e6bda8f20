/** How the CLI fails: one clear message and an exit status, never a stack trace for an expected failure. */

export const EXIT = {
  ok: 0,
  /** The action failed or was refused, the stack is unreachable, or a watched job did not complete. */
  failure: 1,
  /** The command line itself is wrong. */
  usage: 2,
} as const;

export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode: number = EXIT.failure,
  ) {
    super(message);
    this.name = new.target.name;
  }
}

export class UsageError extends CliError {
  constructor(message: string) {
    super(message, EXIT.usage);
  }
}

/** A server answered with a refusal (`{ error, message }`); the message is the server's own. */
export class RefusedError extends CliError {
  constructor(
    readonly status: number,
    readonly code: string,
    readonly serverMessage: string,
    what: string,
  ) {
    super(`${what} was refused (${status} ${code}): ${serverMessage}`);
  }
}

/** Why a fetch never got an answer, in words (connection refused, DNS, timeout). */
export function connectionProblem(error: unknown): string {
  const cause = error instanceof Error ? (error.cause as { code?: unknown; message?: unknown } | undefined) : undefined;
  const code = typeof cause?.code === 'string' ? cause.code : undefined;
  if (code === 'ECONNREFUSED') return 'connection refused';
  if (code === 'ENOTFOUND') return 'host not found';
  if (error instanceof Error && error.name === 'TimeoutError') return 'timed out';
  if (typeof cause?.message === 'string') return cause.message;
  return error instanceof Error ? error.message : String(error);
}
