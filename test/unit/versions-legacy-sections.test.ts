/**
 * A section recorded before versions existed (no `version` field) was written by version 1, exactly
 * like a checkpoint without one: the engine reads it as version 1 (migrated), never by the present
 * schema first, which would take version 1 data that happens to parse as its own. (Found by a hostile review.)
 */
import { z } from 'zod';
import { definePhase } from '../../functions/src/core/pipeline';
import { readStored } from '../../functions/src/core/versions';
import { storedSectionVersion } from '../../functions/src/engine/checkpoints';

// Version 1 recorded amounts in dollars; version 2 records cents and migrates what version 1 wrote.
const items = definePhase<unknown, { totalCents: number }>({
  name: 'items',
  version: 2,
  older: { 1: { state: (old) => ({ totalCents: (old as { total: number }).total * 100 }), section: (old) => ({ amount: (old as { amount: number }).amount * 100 }) } },
  state: z.strictObject({ totalCents: z.number().int() }),
  section: z.strictObject({ amount: z.number().int() }),
  run: () => Promise.resolve({ kind: 'done', state: { totalCents: 0 } }),
});

test('a legacy (unversioned) section is read as version 1, like a legacy checkpoint: migrated, never taken as version 2 data', () => {
  // The checkpoint rule: absent version = 1 (engine/checkpoints.ts passes `version ?? 1`).
  expect(readStored(items, 'checkpoint', { total: 3 }, 1)).toEqual({ kind: 'read', value: { totalCents: 300 }, migratedFrom: 1 });
  // The same dollars in a section recorded before versions existed, read by the engine's rule for a section without a version.
  expect(readStored(items, 'section', { amount: 3 }, storedSectionVersion(undefined))).toEqual({ kind: 'read', value: { amount: 300 }, migratedFrom: 1 });
});
