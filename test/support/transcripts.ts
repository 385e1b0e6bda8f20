/** A section runner's transcript port held in memory for unit tests: nothing stored at first, the latest save kept. */
import type { StoredTranscript, TranscriptPort } from '../../functions/src/agent/section-runner';

export interface KeptTranscript {
  readonly port: TranscriptPort;
  /** The last transcript saved, or null before the first save. */
  last(): StoredTranscript | null;
}

export function keptTranscript(): KeptTranscript {
  let saved: StoredTranscript | null = null;
  return {
    port: {
      load: () => Promise.resolve(null),
      save: (_sectionId, transcript) => {
        saved = transcript;
        return Promise.resolve();
      },
    },
    last: () => saved,
  };
}
