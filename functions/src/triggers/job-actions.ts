import { logger } from 'firebase-functions/logger';
import { onRequest, type HttpsFunction } from 'firebase-functions/v2/https';
import { systemClock } from '../core/clock';
import { createJobActionHandler, type JobActionDeps } from '../http/job-actions-handler';
import { JobStore } from '../store/job-store';
import { firestore, stepQueue, verifyCaller } from './admin';
import { engineOptionsFromEnv } from './config';
import type { Deployment } from './deployment';

/**
 * `cancelJob` (the owner stops a job: no new actions from now on; in-flight effects become
 * `unknown` until checked) and `decideJob` (the owner answers the question a waiting job asks; the
 * job is requeued with the answer), for these pipelines.
 */
export function createJobActions(deployment: Deployment): { readonly cancelJob: HttpsFunction; readonly decideJob: HttpsFunction } {
  let deps: JobActionDeps | undefined;
  const actionDeps = (): JobActionDeps =>
    (deps ??= {
      store: new JobStore(firestore(), systemClock, engineOptionsFromEnv()),
      queue: stepQueue(),
      verifyToken: verifyCaller(),
      pipelines: deployment.pipelines,
      logger,
    });
  let cancel: ReturnType<typeof createJobActionHandler> | undefined;
  let decide: ReturnType<typeof createJobActionHandler> | undefined;
  return {
    cancelJob: onRequest((request, response) => (cancel ??= createJobActionHandler('cancel', actionDeps()))(request, response)),
    decideJob: onRequest((request, response) => (decide ??= createJobActionHandler('decide', actionDeps()))(request, response)),
  };
}
