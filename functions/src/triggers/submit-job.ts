import { logger } from 'firebase-functions/logger';
import { onRequest, type HttpsFunction } from 'firebase-functions/v2/https';
import { systemClock } from '../core/clock';
import type { HttpRequest, HttpResponse } from '../http/request';
import { createSubmitHandler } from '../http/submit-handler';
import { quotaDefaultsFromEnv } from '../config/environment';
import { JobStore } from '../store/job-store';
import { SubmitQuota } from '../store/quota-documents';
import { firestore, stepQueue, verifyCaller } from './admin';
import { engineOptionsFromEnv } from './config';
import type { Deployment } from './deployment';

/** `submitJob` for these pipelines. POST a job; CORS (preflight included) is answered by the handler, so no `cors` option here. */
export function createSubmitJob(deployment: Deployment): HttpsFunction {
  let handler: ((request: HttpRequest, response: HttpResponse) => Promise<void>) | undefined;
  // Built on the first request, not at load, so loading the functions touches no Firebase service.
  const submitHandler = (): ((request: HttpRequest, response: HttpResponse) => Promise<void>) =>
    (handler ??= createSubmitHandler({
      store: new JobStore(firestore(), systemClock, engineOptionsFromEnv()),
      queue: stepQueue(),
      verifyToken: verifyCaller(),
      pipelines: deployment.pipelines,
      logger,
      quota: new SubmitQuota(firestore(), quotaDefaultsFromEnv()),
    }));
  return onRequest((request, response) => submitHandler()(request, response));
}
