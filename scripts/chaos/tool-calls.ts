/**
 * What the soak needs to tell whether a tool call ran again after its result was recorded:
 *
 * - when each result was recorded: a listener on every transcript, noting the first committed
 *   version that holds each call's result (the final documents add theirs when the run ends). A
 *   listener may skip versions when changes come fast or its stream is cut and resumed, so a
 *   sighting can be late, never early: the check can miss a repeat, never invent one;
 * - every execution: the offline toolbox's execution log (PHASELINE_OFFLINE_SETTINGS
 *   `toolExecutionLog`), one line per execution from every function worker, killed ones included.
 */
import { readFile } from 'node:fs/promises';
import type { Firestore, QuerySnapshot } from 'firebase-admin/firestore';
import { parseToolExecutionLog } from '../../functions/src/providers/offline/execution-log';
import { micros, savedTranscriptOf, toolResultIds } from './collect';
import type { ToolExecution, ToolResultSeen } from './model';

export interface ToolResultWatch {
  /** The earliest sighting of each (job, call ID). */
  seen(): ToolResultSeen[];
  /** Times the listener failed and was started again. */
  restarts(): number;
  stop(): void;
}

const RESTART_DELAY_MS = 1_000;

export function watchToolResults(db: Firestore, log: (line: string) => void): ToolResultWatch {
  const earliest = new Map<string, ToolResultSeen>();
  let restarts = 0;
  let unsubscribe: (() => void) | null = null;
  let stopped = false;
  const onSnapshot = (snapshot: QuerySnapshot): void => {
    for (const change of snapshot.docChanges()) {
      if (change.type === 'removed') continue;
      const doc = change.doc;
      const jobId = doc.ref.parent.parent?.id ?? '';
      const commitUs = micros(doc.updateTime);
      for (const callId of toolResultIds(savedTranscriptOf(doc.data()))) {
        const key = `${jobId}\u0000${callId}`;
        const known = earliest.get(key);
        if (known === undefined || commitUs < known.commitUs) earliest.set(key, { jobId, transcript: doc.id, callId, commitUs });
      }
    }
  };
  const start = (): void => {
    if (stopped) return;
    unsubscribe = db.collectionGroup('transcripts').onSnapshot(onSnapshot, (error) => {
      // A failed listener is over; a new one starts from the current documents (versions in between are not seen).
      restarts += 1;
      log(`transcript listener failed (${error.message}); starting it again`);
      setTimeout(start, RESTART_DELAY_MS).unref();
    });
  };
  start();
  return {
    seen: () => [...earliest.values()],
    restarts: () => restarts,
    stop: () => {
      stopped = true;
      unsubscribe?.();
    },
  };
}

/** The execution log; a missing file reads as no executions (the check then reports that it saw none). */
export async function readToolExecutions(path: string): Promise<{ readonly executions: ToolExecution[]; readonly unreadable: number }> {
  const text = await readFile(path, 'utf8').catch((error: unknown) => {
    if ((error as NodeJS.ErrnoException | null)?.code === 'ENOENT') return '';
    throw error;
  });
  const { records, unreadable } = parseToolExecutionLog(text);
  return { executions: records, unreadable };
}
