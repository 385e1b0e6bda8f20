/** The soak's reader: when each document was committed, as the invariant checker compares them. */
import { Timestamp } from 'firebase-admin/firestore';
import { commit, micros } from '../../scripts/chaos/collect';

const created = Timestamp.fromMillis(1_000);
const updated = Timestamp.fromMillis(901_000);
const snapshot = (data: Record<string, unknown>) => ({ get: (field: string): unknown => data[field], createTime: created, updateTime: updated });

describe('chaos collector: commit times', () => {
  test("a document the engine rewrote counts from its last write", () => {
    expect(commit(snapshot({ epoch: 2 }))).toBe(micros(updated));
  });

  test("a document the retention pass stamped counts from its creation: the stamp is the sweeper's write, not the engine's", () => {
    // A transcript save of epoch 2 stamped 15 minutes after its job ended must not read as a write landing after epoch 5.
    expect(commit(snapshot({ epoch: 2, expireAt: Timestamp.fromMillis(2_000_000) }))).toBe(micros(created));
  });
});
