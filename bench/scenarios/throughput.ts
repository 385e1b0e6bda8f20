/**
 * End-to-end throughput through firebase-tools' functions, tasks and auth emulators, with the
 * project's Firestore emulator: the client script runs under `firebase emulators:exec` (see
 * lib/emulator-stack.ts for why from a private directory), submits jobs over HTTP and watches
 * them finish.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO_ROOT } from '../../scripts/lib/stack';
import { runUnderIsolatedEmulators } from '../lib/emulator-stack';
import type { ThroughputJob, ThroughputLevel, ThroughputPlan } from './throughput-client';

export interface ThroughputResult {
  readonly plan: ThroughputPlan;
  readonly warmup: readonly ThroughputJob[];
  readonly levels: readonly ThroughputLevel[];
  /** Why nothing was measured, when nothing was. */
  readonly skipped?: string;
}

export async function measureThroughput(plan: ThroughputPlan, log: (line: string) => void, verbose = false): Promise<ThroughputResult> {
  const dir = mkdtempSync(join(tmpdir(), 'phaseline-bench-'));
  try {
    const planPath = join(dir, 'plan.json');
    const outPath = join(dir, 'out.json');
    writeFileSync(planPath, JSON.stringify(plan));
    const client = join(REPO_ROOT, 'node_modules', '.bin', 'tsx');
    const script = join(REPO_ROOT, 'bench', 'scenarios', 'throughput-client.ts');
    log('  throughput: building the functions and starting the functions, tasks and auth emulators');
    const code = await runUnderIsolatedEmulators(`'${client}' '${script}' '${outPath}' '${planPath}'`, { log, ...(verbose ? { stdio: 'inherit' as const } : {}) });
    if (code !== 0 || !existsSync(outPath)) return { plan, warmup: [], levels: [], skipped: `the emulator run exited with ${code}` };
    const out = JSON.parse(readFileSync(outPath, 'utf8')) as { warmup: ThroughputJob[]; levels: ThroughputLevel[] };
    return { plan, warmup: out.warmup, levels: out.levels };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
