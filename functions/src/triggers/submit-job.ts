import { getAuth } from 'firebase-admin/auth';
import { logger } from 'firebase-functions/logger';
import { onRequest } from 'firebase-functions/v2/https';
import { systemClock } from '../core/clock';
import { createSubmitHandler, type HttpRequest, type HttpResponse } from '../http/submit-handler';
import { quotaDefaultsFromEnv } from '../config/environment';
import { JobStore } from '../store/job-store';
import { SubmitQuota } from '../store/quota-documents';
import { adminApp, firestore, stepQueue } from './admin';
import { engineOptionsFromEnv } from './config';
import { pipelines } from './pipelines';

let handler: ((request: HttpRequest, response: HttpResponse) => Promise<void>) | undefined;

/** Built on the first request, not at import, so loading the module touches no Firebase service. */
function submitHandler(): (request: HttpRequest, response: HttpResponse) => Promise<void> {
  handler ??= createSubmitHandler({
    store: new JobStore(firestore(), systemClock, engineOptionsFromEnv()),
    queue: stepQueue(),
    // Under the emulators FIREBASE_AUTH_EMULATOR_HOST makes this accept the Auth emulator's tokens.
    verifyToken: async (token) => {
      const decoded = await getAuth(adminApp()).verifyIdToken(token);
      return { uid: decoded.uid, signInProvider: decoded.firebase.sign_in_provider };
    },
    pipelines,
    logger,
    quota: new SubmitQuota(firestore(), quotaDefaultsFromEnv()),
  });
  return handler;
}

/** POST a job; CORS (preflight included) is answered by the handler, so no `cors` option here. */
export const submitJob = onRequest((request, response) => submitHandler()(request, response));
