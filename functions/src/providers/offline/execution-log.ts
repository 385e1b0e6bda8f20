/**
 * Test instrumentation, off by default: when the offline settings name a file
 * (`toolExecutionLog`), the corpus toolbox appends one JSON line to it per tool execution. The
 * chaos soak reads it to check that no tool call runs again once its result is recorded. In-memory
 * counts (`CorpusToolbox.stats`) die with a killed worker; a file every worker process appends to
 * does not.
 */
import { appendFileSync } from 'node:fs';
import { z } from 'zod';

export const toolExecutionRecordSchema = z.object({
  callId: z.string(),
  tool: z.string(),
  /** Wall-clock time the execution began (not the injected clock: it is compared with Firestore commit times). */
  startedAtMs: z.number(),
  /** False for a simulated interrupted result: the call ran, its result never reached the caller. */
  delivered: z.boolean(),
  pid: z.number().int(),
  /** The toolbox said the call has no external effect (it may run again). */
  repeatable: z.boolean().optional(),
  /** The claim the call ran under (the step's unit, null for the job's own step, and its epoch); absent outside a claimed step. */
  claim: z.object({ unit: z.string().nullable(), epoch: z.number().int() }).optional(),
});

export type ToolExecutionRecord = z.infer<typeof toolExecutionRecordSchema>;

/** One synchronous append per execution: the line is written before the result is handed back. */
export function appendToolExecution(path: string, record: ToolExecutionRecord): void {
  appendFileSync(path, `${JSON.stringify(record)}\n`);
}

/** Parses a log's text; lines that do not parse are counted, not trusted. */
export function parseToolExecutionLog(text: string): { readonly records: ToolExecutionRecord[]; readonly unreadable: number } {
  const records: ToolExecutionRecord[] = [];
  let unreadable = 0;
  for (const line of text.split('\n')) {
    if (line.trim() === '') continue;
    let parsed: ReturnType<typeof toolExecutionRecordSchema.safeParse>;
    try {
      parsed = toolExecutionRecordSchema.safeParse(JSON.parse(line));
    } catch {
      unreadable += 1;
      continue;
    }
    if (parsed.success) records.push(parsed.data);
    else unreadable += 1;
  }
  return { records, unreadable };
}
