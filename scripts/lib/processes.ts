import { spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';

/** Spawns a command in its own process group so that stopping it stops everything it started. */
export function spawnGroup(command: string, args: readonly string[], options: SpawnOptions = {}): ChildProcess {
  return spawn(command, args, { stdio: 'inherit', ...options, detached: true });
}

export function signalGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  try {
    process.kill(-child.pid, signal);
  } catch {
    // The group is already gone.
  }
}

/** Resolves with the exit code (128 + signal number style codes for signals). */
export function exitCodeOf(child: ChildProcess): Promise<number> {
  return new Promise((resolve) => {
    child.once('exit', (code, signal) => resolve(code ?? (signal ? 128 + 15 : 1)));
  });
}

/** Stops a process group: SIGTERM, then SIGKILL after a grace period. */
export async function stopGroup(child: ChildProcess, graceMs = 10_000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) {
    signalGroup(child, 'SIGKILL'); // leftovers of the group, if any
    return;
  }
  const exited = exitCodeOf(child);
  signalGroup(child, 'SIGTERM');
  const timer = setTimeout(() => signalGroup(child, 'SIGKILL'), graceMs);
  await exited;
  clearTimeout(timer);
  signalGroup(child, 'SIGKILL');
}
