/**
 * `opsAction`: the operator console's actions over HTTP (see http/ops-handler.ts). The ID token is
 * verified with revocation checked (verifyCaller, as every endpoint), so `phaseline admin revoke`
 * (which also revokes the user's refresh tokens) takes effect within seconds, not when the token expires.
 */
import { logger } from 'firebase-functions/logger';
import { onRequest, type HttpsFunction } from 'firebase-functions/v2/https';
import { systemClock } from '../core/clock';
import { createOpsActionHandler, OPERATOR_CLAIM } from '../http/ops-handler';
import { JobStore } from '../store/job-store';
import { firestore, stepQueue, verifyCaller } from './admin';
import { engineOptionsFromEnv } from './config';
import type { Deployment } from './deployment';

/** `opsAction` for these pipelines: an operator releases, cancels or re-drives any job; every call checks the `admin` claim. */
export function createOpsAction(deployment: Deployment): HttpsFunction {
  let handler: ReturnType<typeof createOpsActionHandler> | undefined;
  const opsHandler = (): ReturnType<typeof createOpsActionHandler> =>
    (handler ??= createOpsActionHandler({
      store: new JobStore(firestore(), systemClock, engineOptionsFromEnv()),
      queue: stepQueue(),
      pipelines: deployment.pipelines,
      verifyToken: async (token) => {
        const caller = await verifyCaller()(token);
        return { uid: caller.uid, admin: caller.claims[OPERATOR_CLAIM] === true };
      },
      logger,
    }));
  return onRequest((request, response) => opsHandler()(request, response));
}
