/**
 * The processes the soak started, found from `ps` by parentage (never by name alone: other
 * stacks may run on the same machine). The local stack spawns the Firestore emulator (java) and
 * firebase-tools directly from this process; firebase-tools runs each function invocation in a
 * worker child (`functionsEmulatorRuntime`), one invocation per worker at a time.
 */
import { execFile } from 'node:child_process';
import { readdir, readFile, readlink } from 'node:fs/promises';

export interface ProcessRow {
  readonly pid: number;
  readonly ppid: number;
  readonly pgid: number;
  /** ps's state letters: `R`, `S`, `T` (stopped), `Z` (a zombie: exited, not yet reaped), … */
  readonly stat: string;
  readonly args: string;
}

/** Parses `ps -eo pid=,ppid=,pgid=,stat=,args=`. */
export function parsePs(output: string): ProcessRow[] {
  const rows: ProcessRow[] = [];
  for (const line of output.split('\n')) {
    const match = /^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(.*)$/.exec(line);
    if (match?.[1] === undefined || match[2] === undefined || match[3] === undefined || match[4] === undefined || match[5] === undefined) continue;
    rows.push({ pid: Number(match[1]), ppid: Number(match[2]), pgid: Number(match[3]), stat: match[4], args: match[5] });
  }
  return rows;
}

/** Exited processes whose parent has not reaped them yet hold no resources but a table entry. */
export const isZombie = (row: ProcessRow): boolean => row.stat.startsWith('Z');

/** What the soak starts: the Firestore emulator's JVM, firebase-tools, its function workers. */
export const STACK_COMMAND = /\bjava\b|\bfirebase\b|functionsEmulatorRuntime|cloud-firestore-emulator/;

export function listProcesses(): Promise<ProcessRow[]> {
  return new Promise((resolve, reject) => {
    execFile('ps', ['-eo', 'pid=,ppid=,pgid=,stat=,args='], { maxBuffer: 8 * 1024 * 1024 }, (error, stdout) => {
      if (error) reject(new Error(`ps failed: ${error.message}`));
      else resolve(parsePs(stdout));
    });
  });
}

/** Every process below `root`, children first found first. */
export function descendants(rows: readonly ProcessRow[], root: number): ProcessRow[] {
  const found: ProcessRow[] = [];
  const frontier = [root];
  for (let parent = frontier.shift(); parent !== undefined; parent = frontier.shift()) {
    for (const row of rows) {
      if (row.ppid === parent && !found.includes(row)) {
        found.push(row);
        frontier.push(row.pid);
      }
    }
  }
  return found;
}

export interface StackProcesses {
  /** `firebase emulators:start`, a child of this process. */
  readonly firebase: ProcessRow | null;
  /** firebase-tools' function workers. */
  readonly workers: readonly ProcessRow[];
  /** The Firestore emulator's JVM, when this process started it. */
  readonly firestore: ProcessRow | null;
}

export function stackProcesses(rows: readonly ProcessRow[], self: number): StackProcesses {
  const children = rows.filter((row) => row.ppid === self);
  const firebase = children.find((row) => /\bfirebase\b.*\bemulators:start\b/.test(row.args)) ?? null;
  const firestore = children.find((row) => /\bjava\b/.test(row.args) && /CloudFirestore|cloud-firestore-emulator/.test(row.args)) ?? null;
  const workers = firebase ? descendants(rows, firebase.pid).filter((row) => row.args.includes('functionsEmulatorRuntime')) : [];
  return { firebase, workers, firestore };
}

/** The worker name the engine puts on a lease is `${hostname}-${pid}-${8 hex}`: its process ID. */
export function workerPid(leaseWorker: string): number | null {
  const match = /-(\d+)-[0-9a-f]{8}$/.exec(leaseWorker);
  return match?.[1] === undefined ? null : Number(match[1]);
}

export function signal(pid: number, name: NodeJS.Signals): boolean {
  try {
    process.kill(pid, name);
    return true;
  } catch {
    return false;
  }
}

/**
 * The local ports of `pid`'s TCP connections to `remotePort` on this machine (Linux: its socket
 * inodes from /proc/PID/fd, matched in /proc/net/tcp and tcp6). Empty when the process is gone.
 */
export async function connectionPorts(pid: number, remotePort: number): Promise<Set<number>> {
  const inodes = new Set<string>();
  const fds = await readdir(`/proc/${pid}/fd`).catch(() => [] as string[]);
  await Promise.all(
    fds.map(async (fd) => {
      const target = await readlink(`/proc/${pid}/fd/${fd}`).catch(() => '');
      const match = /^socket:\[(\d+)\]$/.exec(target);
      if (match?.[1] !== undefined) inodes.add(match[1]);
    }),
  );
  const ports = new Set<number>();
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    const text = await readFile(table, 'utf8').catch(() => '');
    for (const line of text.split('\n').slice(1)) {
      const fields = line.trim().split(/\s+/);
      const [local, remote, inode] = [fields[1], fields[2], fields[9]];
      if (local === undefined || remote === undefined || inode === undefined || !inodes.has(inode)) continue;
      if (Number.parseInt(remote.split(':').at(-1) ?? '', 16) !== remotePort) continue;
      ports.add(Number.parseInt(local.split(':').at(-1) ?? '', 16));
    }
  }
  return ports;
}
