import { logger } from 'firebase-functions';
import { onTaskDispatched, type TaskQueueFunction } from 'firebase-functions/v2/tasks';
import { quotaDefaultsFromEnv, refuseUnpricedProvider, stepQueueLimitsFromEnv, tracingConfigFromEnv } from '../config/environment';
import { systemClock } from '../core/clock';
import { runStepWhenDue } from '../engine/step/due-wait';
import type { RunnerDeps } from '../engine/step/deps';
import { STEP_TIMEOUT_SECONDS } from '../store/cloud-tasks-queue';
import { JobStore } from '../store/job-store';
import { SpendLedger } from '../store/quota-documents';
import { NO_TRACING, startTracing, stepLogger, traceStep, type LogSink, type StepLogger, type Tracing } from '../telemetry';
import { firestore, stepQueue } from './admin';
import { engineOptionsFromEnv } from './config';
import type { Deployment } from './deployment';
import { stepSecrets } from './secrets';

/**
 * Log lines go through the Cloud Functions logger (one JSON line each, as Cloud Logging reads them),
 * carrying the step's fields and trace (telemetry/logging.ts). Called at write time, not bound
 * once, so a test that watches the logger sees them.
 */
const functionsLogger: LogSink = ({ severity, message, ...fields }) => {
  if (severity === 'ERROR') logger.error(message, fields);
  else if (severity === 'WARNING') logger.warn(message, fields);
  else if (severity === 'DEBUG') logger.debug(message, fields);
  else logger.info(message, fields);
};

/** The project the trace field names: set by the Cloud Functions runtime (and the emulator), read when a step runs. */
const project = (): string | undefined => process.env.GCLOUD_PROJECT ?? process.env.GOOGLE_CLOUD_PROJECT;
let stepLog: StepLogger | undefined;
const log = (): StepLogger => (stepLog ??= stepLogger({ project: project(), sink: functionsLogger }));

let tracing: Promise<Tracing> | undefined;
/** Exporting as configured, from the first step on; a bad setting is logged and the steps run untraced, never failed for it. */
function tracingStarted(): Promise<Tracing> {
  tracing ??= (async () => startTracing(tracingConfigFromEnv(), { serviceName: 'runJobStep', project: project() }))().catch((error: unknown) => {
    log().error('tracing is off: its configuration was refused', { error });
    return NO_TRACING;
  });
  return tracing;
}

/**
 * `runJobStep` for these pipelines: one task, one bounded step. Cloud Tasks retries every non-2xx
 * answer, so every outcome that should not be redelivered (done, handed off, not claimable,
 * malformed, failed) returns normally.
 */
export function createRunJobStep(deployment: Deployment): TaskQueueFunction<unknown> {
  // A priced provider without its prices would run past every daily spend limit: the functions do not load (a deploy stops here, naming the variables).
  refuseUnpricedProvider();
  let deps: RunnerDeps | undefined;
  const runnerDeps = (): RunnerDeps =>
    (deps ??= {
      store: new JobStore(firestore(), systemClock, engineOptionsFromEnv()),
      queue: stepQueue(),
      pipelines: deployment.pipelines,
      random: Math.random,
      // What a step reports through deps.log is a problem it met (a write kept for later, a lost claim, a rejected task).
      log: (message, detail) => log().warn(message, detail),
      spendLedger: new SpendLedger(firestore(), quotaDefaultsFromEnv()),
    });
  return onTaskDispatched<unknown>(
    {
      retryConfig: { maxAttempts: 20, minBackoffSeconds: 2, maxBackoffSeconds: 300, maxDoublings: 8 },
      rateLimits: stepQueueLimitsFromEnv(),
      timeoutSeconds: STEP_TIMEOUT_SECONDS,
      memory: '512MiB',
      // Each key is bound only when its backend is configured (read from functions/.env.<project> at deploy).
      secrets: stepSecrets(),
    },
    async (request) => {
      const traced = await tracingStarted();
      let outcome;
      try {
        // One span per step, under the trace the request's headers name; every line and span of the step carries its job, step, unit, epoch and phase.
        outcome = await traceStep(
          { headers: request.headers, task: request.data, attributes: { 'phaseline.task.retry_count': request.retryCount } },
          async () => {
            const startedMs = Date.now();
            const { outcome: finished, waitedMs, claimTries } = await runStepWhenDue(runnerDeps(), request.data);
            // tookMs: from the step's start in its request (tracing set up) to its outcome, the due wait (waitedMs) included.
            log().info('step finished', { outcome: finished, task: request.data, retryCount: request.retryCount, waitedMs, claimTries, tookMs: Date.now() - startedMs });
            return { finished, waitedMs, claimTries };
          },
          ({ finished, waitedMs, claimTries }) => ({ 'phaseline.outcome': finished.kind, 'phaseline.due_wait_ms': waitedMs, 'phaseline.claim_tries': claimTries }),
        );
      } finally {
        // Before answering: an instance that has answered may have no CPU left to export with.
        await traced.flush();
      }
      const { finished } = outcome;
      if (finished.kind === 'not-yet-due') {
        // The only wanted redelivery: the job is backing off, or its holder is live, past what the step waits for in its request.
        throw new Error(`Job is backing off for another ${Math.ceil(finished.retryAfterMs / 1000)} s; redeliver later`);
      }
    },
  );
}
