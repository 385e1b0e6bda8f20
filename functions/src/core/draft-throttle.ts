/**
 * Paces the drafts of sections in flight: the text a model is writing, shown to the person
 * watching. Each section's draft is written at most once per `minIntervalMs`, always with the
 * latest text, and a write never overlaps the previous one of the same section. A draft is a
 * view, not state: a failed write is reported and forgotten (the next text replaces it), and
 * after `stop()` nothing more is written, so a step that ended leaves no timer behind.
 */
import type { Clock } from './clock';
import type { Timers } from './flusher';

export interface DraftThrottleOptions {
  readonly minIntervalMs: number;
  readonly clock: Clock;
  readonly timers: Timers;
  readonly onWriteError?: (error: unknown) => void;
}

interface SectionDraft {
  /** Text not written yet, or null when the last write carried the latest. */
  pending: string | null;
  lastWriteMs: number;
  timer: unknown;
  writing: boolean;
}

export class DraftThrottle {
  private readonly drafts = new Map<string, SectionDraft>();
  private stopped = false;
  /** Writes started, for tests and the bench. */
  writes = 0;

  constructor(
    private readonly write: (sectionId: string, text: string) => Promise<void>,
    private readonly options: DraftThrottleOptions,
  ) {}

  show(sectionId: string, text: string): void {
    if (this.stopped) return;
    let draft = this.drafts.get(sectionId);
    if (draft === undefined) {
      draft = { pending: null, lastWriteMs: Number.NEGATIVE_INFINITY, timer: null, writing: false };
      this.drafts.set(sectionId, draft);
    }
    draft.pending = text;
    this.schedule(sectionId, draft);
  }

  /** Writes nothing more and clears every timer; a write in flight finishes on its own. */
  stop(): void {
    this.stopped = true;
    for (const draft of this.drafts.values()) {
      if (draft.timer !== null) this.options.timers.clearTimeout(draft.timer);
      draft.timer = null;
      draft.pending = null;
    }
  }

  private schedule(sectionId: string, draft: SectionDraft): void {
    if (draft.timer !== null || draft.writing) return;
    const waitMs = draft.lastWriteMs + this.options.minIntervalMs - this.options.clock.now();
    if (waitMs <= 0) {
      void this.flush(sectionId, draft);
      return;
    }
    draft.timer = this.options.timers.setTimeout(() => {
      draft.timer = null;
      void this.flush(sectionId, draft);
    }, waitMs);
  }

  private async flush(sectionId: string, draft: SectionDraft): Promise<void> {
    const text = draft.pending;
    if (this.stopped || text === null) return;
    draft.pending = null;
    draft.writing = true;
    draft.lastWriteMs = this.options.clock.now();
    this.writes += 1;
    try {
      await this.write(sectionId, text);
    } catch (error) {
      this.options.onWriteError?.(error);
    } finally {
      draft.writing = false;
      // Text shown while this write was out, unless stop() came meanwhile (both change during the await).
      const shownMeanwhile = draft.pending as string | null;
      if (shownMeanwhile !== null && !(this.stopped as boolean)) this.schedule(sectionId, draft);
    }
  }
}
