/** Where the CLI writes. Commands take an Io, so tests read what a person would have seen. */
export interface Io {
  /** A line for stdout: results a script may capture (a task ID, a list). */
  out(line: string): void;
  /** A line for stderr: messages for the person (progress notes, errors). */
  err(line: string): void;
  /**
   * Shows a status line that the next call replaces (a progress bar). On a terminal it is
   * redrawn in place; elsewhere each new status is printed as a line of its own.
   */
  status(line: string): void;
  /** Ends the status line, if one is showing, so that normal lines follow it. */
  endStatus(): void;
  /** Width to fit a status line into. */
  readonly columns: number;
}

const CLEAR_LINE = '\r\x1b[2K';

export function processIo(stdout: NodeJS.WriteStream = process.stdout, stderr: NodeJS.WriteStream = process.stderr): Io {
  const interactive = stdout.isTTY;
  let showing: string | null = null;
  const clear = (): void => {
    if (interactive && showing !== null) stdout.write(CLEAR_LINE);
  };
  const redraw = (): void => {
    if (interactive && showing !== null) stdout.write(showing);
  };
  return {
    out(line) {
      clear();
      stdout.write(`${line}\n`);
      redraw();
    },
    err(line) {
      clear();
      stderr.write(`${line}\n`);
      redraw();
    },
    status(line) {
      if (!interactive) {
        if (line !== showing) stdout.write(`${line}\n`);
        showing = line;
        return;
      }
      const fitted = line.length >= stdout.columns ? line.slice(0, Math.max(0, stdout.columns - 1)) : line;
      stdout.write(`${CLEAR_LINE}${fitted}`);
      showing = fitted;
    },
    endStatus() {
      if (interactive && showing !== null) stdout.write('\n');
      showing = null;
    },
    get columns() {
      return interactive ? stdout.columns : 100;
    },
  };
}

/** An Io that keeps every line, for tests: statuses are kept in the order shown, repeats dropped. */
export interface BufferedIo extends Io {
  readonly stdout: string[];
  readonly stderr: string[];
  readonly statuses: string[];
  /** stdout and stderr lines and statuses interleaved as they were written. */
  readonly all: string[];
}

export function bufferedIo(columns = 100): BufferedIo {
  const stdout: string[] = [];
  const stderr: string[] = [];
  const statuses: string[] = [];
  const all: string[] = [];
  return {
    stdout,
    stderr,
    statuses,
    all,
    columns,
    out(line) {
      stdout.push(line);
      all.push(line);
    },
    err(line) {
      stderr.push(line);
      all.push(line);
    },
    status(line) {
      if (statuses.at(-1) === line) return;
      statuses.push(line);
      all.push(line);
    },
    endStatus: () => undefined,
  };
}
