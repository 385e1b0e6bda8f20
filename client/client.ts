/**
 * The client a chat UI holds: the HTTP calls (http.ts) and the Firestore watch (watch.ts) over one
 * signed-in user.
 */
import type { Firestore, Unsubscribe } from 'firebase/firestore';
import { createPhaselineApi, type PhaselineApi, type PhaselineApiOptions } from './http';
import { waitForJob, watchJob, type JobSnapshot, type WaitForJobOptions, type WatchOptions } from './watch';

/** What the client needs: the HTTP options (functions, ID token, and optionally fetch, clock, retries) and the user's Firestore. */
export interface PhaselineClientOptions extends PhaselineApiOptions {
  /** The Firestore of the signed-in user's app: watches read through it, under the security rules. */
  readonly db: Firestore;
}

/** Submit, cancel and answer over HTTP; watch through Firestore. */
export interface PhaselineClient extends PhaselineApi {
  /** {@link watchJob} on the client's Firestore. */
  watch(jobId: string, onChange: (snapshot: JobSnapshot) => void, options?: WatchOptions): Unsubscribe;
  /** {@link waitForJob} on the client's Firestore. */
  waitFor(jobId: string, done: (snapshot: JobSnapshot) => boolean, options?: WaitForJobOptions): Promise<JobSnapshot>;
}

/** Creates the client. */
export function createPhaselineClient(options: PhaselineClientOptions): PhaselineClient {
  const { db, ...apiOptions } = options;
  const api = createPhaselineApi(apiOptions);
  return {
    submit: (request, callOptions) => api.submit(request, callOptions),
    cancel: (jobId, reason, callOptions) => api.cancel(jobId, reason, callOptions),
    answer: (jobId, questionId, answer, callOptions) => api.answer(jobId, questionId, answer, callOptions),
    watch: (jobId, onChange, watchOptions) => watchJob(db, jobId, onChange, watchOptions),
    waitFor: (jobId, done, waitOptions) => waitForJob(db, jobId, done, waitOptions),
  };
}
