import { FieldValue } from 'firebase-admin/firestore';
import { onTaskDispatched } from 'firebase-functions/v2/tasks';
import { firestore } from './admin';

export const runJobStep = onTaskDispatched<{ jobId: string }>({ retryConfig: { maxAttempts: 5 } }, async (request) => {
  await firestore().doc(`jobs/${request.data.jobId}`).update({ status: 'completed', finishedAt: FieldValue.serverTimestamp() });
});
