import { logger } from 'firebase-functions/logger';
import { onRequest } from 'firebase-functions/v2/https';
import { systemClock } from '../core/clock';
import { createJobActionHandler, type JobActionDeps } from '../http/job-actions-handler';
import { JobStore } from '../store/job-store';
import { firestore, stepQueue, verifyCaller } from './admin';
import { engineOptionsFromEnv } from './config';
import { pipelines } from './pipelines';

let deps: JobActionDeps | undefined;
function actionDeps(): JobActionDeps {
  deps ??= {
    store: new JobStore(firestore(), systemClock, engineOptionsFromEnv()),
    queue: stepQueue(),
    verifyToken: verifyCaller(),
    pipelines,
    logger,
  };
  return deps;
}

let cancel: ReturnType<typeof createJobActionHandler> | undefined;
let decide: ReturnType<typeof createJobActionHandler> | undefined;

/** The owner stops a job: no new actions from now on; in-flight effects become `unknown` until checked. */
export const cancelJob = onRequest((request, response) => (cancel ??= createJobActionHandler('cancel', actionDeps()))(request, response));

/** The owner answers the question a waiting job asks; the job is requeued with the answer. */
export const decideJob = onRequest((request, response) => (decide ??= createJobActionHandler('decide', actionDeps()))(request, response));
