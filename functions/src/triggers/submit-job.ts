import { logger } from 'firebase-functions/logger';
import { onRequest } from 'firebase-functions/v2/https';
import { systemClock } from '../core/clock';
import type { HttpRequest, HttpResponse } from '../http/request';
import { createSubmitHandler } from '../http/submit-handler';
import { quotaDefaultsFromEnv } from '../config/environment';
import { JobStore } from '../store/job-store';
import { SubmitQuota } from '../store/quota-documents';
import { firestore, stepQueue, verifyCaller } from './admin';
import { engineOptionsFromEnv } from './config';
import { pipelines } from './pipelines';

let handler: ((request: HttpRequest, response: HttpResponse) => Promise<void>) | undefined;

/** Built on the first request, not at import, so loading the module touches no Firebase service. */
function submitHandler(): (request: HttpRequest, response: HttpResponse) => Promise<void> {
  handler ??= createSubmitHandler({
    store: new JobStore(firestore(), systemClock, engineOptionsFromEnv()),
    queue: stepQueue(),
    verifyToken: verifyCaller(),
    pipelines,
    logger,
    quota: new SubmitQuota(firestore(), quotaDefaultsFromEnv()),
  });
  return handler;
}

/** POST a job; CORS (preflight included) is answered by the handler, so no `cors` option here. */
export const submitJob = onRequest((request, response) => submitHandler()(request, response));
