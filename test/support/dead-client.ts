/**
 * A client that dies inside a change: its store reads and decides as the real one does, then never
 * sends the commit (the change's promise never settles), as a process frozen or killed between
 * deciding and committing. Through the door nothing is locked before the commit, so nobody else may
 * wait on it: the tests that use this make a second actor commit on the same job at once.
 */
import type { JobStore } from '../../functions/src/store/job-store';

export interface DyingClient {
  /** The store to hand the dying client: its `which`-th change (from 1) decides and then hangs. */
  readonly store: JobStore;
  /** Resolves once the dying change has read and decided everything it commits. */
  readonly decided: Promise<void>;
}

export function dyingInsideItsChange(store: JobStore, which = 1): DyingClient {
  let signal: () => void = () => undefined;
  const decided = new Promise<void>((resolve) => {
    signal = resolve;
  });
  let changes = 0;
  const dying = Object.create(store) as JobStore;
  const apply: JobStore['apply'] = (owner, decide) => {
    changes += 1;
    if (changes !== which) return store.apply(owner, decide);
    return store.apply(owner, async (current) => {
      await decide(current);
      signal();
      // The commit is never sent.
      return new Promise<never>(() => undefined);
    });
  };
  dying.apply = apply;
  return { store: dying, decided };
}
