/** The numbered sections of results.md, named once: the report's headings and the Targets table's references use these. */
export const SECTION = {
  comparison: '1. Phaseline against the approaches people use today',
  overhead: '2. Durability overhead',
  writeRate: '3. Write rate on the job document',
  sweeper: '4. Sweeper cost',
  contention: '5. Claim contention',
  throughput: '6. End-to-end throughput through the emulators',
  capacity: '7. Capacity and cost model',
} as const;

export type SectionKey = keyof typeof SECTION;

/** The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens. */
export function anchor(heading: string): string {
  return heading
    .toLowerCase()
    .replace(/[^\p{L}\p{N} _-]/gu, '')
    .replace(/ /g, '-');
}
