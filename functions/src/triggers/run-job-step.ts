import { logger } from 'firebase-functions';
import { onTaskDispatched } from 'firebase-functions/v2/tasks';
import { modelApiKeyNeeded, quotaDefaultsFromEnv, tavilyApiKeyNeeded } from '../config/environment';
import { systemClock } from '../core/clock';
import { runStep, type RunnerDeps } from '../engine/runner';
import { modelApiKey, tavilyApiKey } from '../pipelines/providers';
import { JobStore } from '../store/job-store';
import { SpendLedger } from '../store/quota-documents';
import { firestore, stepQueue } from './admin';
import { engineOptionsFromEnv } from './config';
import { pipelines } from './pipelines';

let deps: RunnerDeps | undefined;
function runnerDeps(): RunnerDeps {
  deps ??= {
    store: new JobStore(firestore(), systemClock, engineOptionsFromEnv()),
    queue: stepQueue(),
    pipelines,
    random: Math.random,
    log: (message, detail) => logger.info(message, detail),
    spendLedger: new SpendLedger(firestore(), quotaDefaultsFromEnv()),
  };
  return deps;
}

/**
 * One task, one bounded step. Cloud Tasks retries every non-2xx answer, so every outcome that
 * should not be redelivered (done, handed off, not claimable, malformed, failed) returns normally.
 */
export const runJobStep = onTaskDispatched<unknown>(
  {
    retryConfig: { maxAttempts: 20, minBackoffSeconds: 2, maxBackoffSeconds: 300, maxDoublings: 8 },
    rateLimits: { maxConcurrentDispatches: 100, maxDispatchesPerSecond: 50 },
    timeoutSeconds: 540,
    memory: '512MiB',
    // The API key is bound only when a keyed provider is configured (read from functions/.env.<project>
    // at deploy), so the offline default and the emulators need no secret.
    // Each key is bound only when its backend is configured: an unbound secret is not asked for at deploy.
    secrets: [...(modelApiKeyNeeded() ? [modelApiKey] : []), ...(tavilyApiKeyNeeded() ? [tavilyApiKey] : [])],
  },
  async (request) => {
    const outcome = await runStep(runnerDeps(), request.data);
    logger.info('step finished', { outcome, task: request.data, retryCount: request.retryCount });
    if (outcome.kind === 'not-yet-due') {
      // The only wanted redelivery: the job is backing off and this task came early.
      throw new Error(`Job is backing off for another ${Math.ceil(outcome.retryAfterMs / 1000)} s; redeliver later`);
    }
  },
);
