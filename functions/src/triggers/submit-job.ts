import { getAuth } from 'firebase-admin/auth';
import { FieldValue } from 'firebase-admin/firestore';
import { getFunctions } from 'firebase-admin/functions';
import { onRequest } from 'firebase-functions/v2/https';
import { adminApp, firestore } from './admin';

export const submitJob = onRequest({ cors: true }, async (request, response) => {
  if (request.method !== 'POST') {
    response.status(405).json({ error: 'Use POST.' });
    return;
  }
  const token = /^Bearer (.+)$/.exec(request.get('authorization') ?? '')?.[1];
  let owner: string;
  try {
    owner = (await getAuth(adminApp()).verifyIdToken(token ?? '')).uid;
  } catch {
    response.status(401).json({ error: 'A valid Firebase ID token is required.' });
    return;
  }
  const db = firestore();
  const job = db.collection('jobs').doc();
  await job.set({ owner, status: 'queued', createdAt: FieldValue.serverTimestamp() });
  await getFunctions(adminApp()).taskQueue('runJobStep').enqueue({ jobId: job.id }, { id: `${job.id}-0-0` });
  response.status(202).json({ taskId: job.id, status: 'queued', statusPath: `jobs/${job.id}` });
});
