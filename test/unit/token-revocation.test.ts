/**
 * Disabled and revoked accounts, without the Auth emulator (which checks revocation on every
 * verification, so tests through it cannot tell whether the functions ask for the check): the
 * exported HTTP triggers run with a stand-in Auth that refuses such an account only when asked to
 * check revocation, as the admin SDK does in production. Also the verifier's reuse of a positive
 * check (per uid, for a few seconds, never for a token from an earlier sign-in).
 */
import { initializeApp } from 'firebase-admin/app';
import { getFirestore } from 'firebase-admin/firestore';
import { ManualClock } from '../../functions/src/core/clock';
import { revocationCheckingVerifier, REVOCATION_CHECK_REUSE_MS, type DecodedIdToken, type IdTokenAuth } from '../../functions/src/http/caller-identity';
import { cancelJob, decideJob, opsAction, submitJob } from '../../functions/src/index';
import { provideBackends } from '../../functions/src/triggers/admin';
import { RecordingTaskQueue } from '../support/task-queue';
import { RecordingResponse as FakeResponse } from '../support/http';

/** Tokens are `<uid>.<sign-in time in seconds>`; an account is revoked from a time on, or disabled. */
class StandInAuth implements IdTokenAuth {
  readonly revokedBefore = new Map<string, number>();
  readonly disabled = new Set<string>();
  readonly operators = new Set<string>();
  lookups = 0;

  verifyIdToken(token: string, checkRevoked = false): Promise<DecodedIdToken> {
    const match = /^([a-z0-9-]+)\.(\d+)$/.exec(token);
    if (!match) return Promise.reject(Object.assign(new Error('Decoding Firebase ID token failed'), { code: 'auth/argument-error' }));
    const uid = match[1] ?? '';
    const authTime = Number(match[2]);
    if (checkRevoked) {
      this.lookups += 1;
      if (this.disabled.has(uid)) return Promise.reject(Object.assign(new Error('The user record is disabled.'), { code: 'auth/user-disabled' }));
      const cutoff = this.revokedBefore.get(uid);
      if (cutoff !== undefined && authTime < cutoff) return Promise.reject(Object.assign(new Error('The Firebase ID token has been revoked.'), { code: 'auth/id-token-revoked' }));
    }
    const decoded: DecodedIdToken = { uid, auth_time: authTime, firebase: { sign_in_provider: 'password' }, ...(this.operators.has(uid) ? { admin: true } : {}) };
    return Promise.resolve(decoded);
  }
}


type Trigger = (request: unknown, response: unknown) => Promise<void>;

async function post(trigger: unknown, token: string, body: unknown): Promise<FakeResponse> {
  const headers: Record<string, string> = { authorization: `Bearer ${token}`, 'content-type': 'application/json' };
  const response = new FakeResponse();
  const rawBody = Buffer.from(JSON.stringify(body));
  await (trigger as Trigger)({ method: 'POST', headers, get: (name: string) => headers[name.toLowerCase()], header: (name: string) => headers[name.toLowerCase()], body, rawBody }, response);
  return response;
}

const auth = new StandInAuth();

beforeAll(() => {
  // Nothing below reaches Firestore: every request is answered before the first read.
  const app = initializeApp({ projectId: 'demo-token-revocation' }, 'token-revocation');
  provideBackends({ firestore: getFirestore(app), queue: new RecordingTaskQueue(), auth });
});

describe('the HTTP triggers', () => {
  // Bodies each endpoint refuses with 400 before any read: an account in good standing gets that far.
  const endpoints: readonly (readonly [string, unknown, unknown])[] = [
    ['submitJob', submitJob, { pipeline: 'no-such-pipeline', input: {} }],
    ['cancelJob', cancelJob, { reason: 'no job named' }],
    ['decideJob', decideJob, { jobId: 'job-1' }],
    ['opsAction', opsAction, { action: 'no-such-action' }],
  ];

  test.each(endpoints)('bug 31: %s refuses the token of a revoked account and of a disabled one (401), and takes a good one', async (_name, trigger, badBody) => {
    auth.operators.add('revoked-user').add('disabled-user').add('good-user');
    auth.revokedBefore.set('revoked-user', 2_000);
    auth.disabled.add('disabled-user');

    const revoked = await post(trigger, 'revoked-user.1000', badBody);
    expect(revoked.statusCode).toBe(401);
    expect(revoked.headers.get('www-authenticate')).toContain('invalid_token');
    expect((await post(trigger, 'disabled-user.1000', badBody)).statusCode).toBe(401);
    // The same account signed in again after the revocation is let in.
    expect((await post(trigger, 'revoked-user.3000', badBody)).statusCode).toBe(400);
    expect((await post(trigger, 'good-user.1000', badBody)).statusCode).toBe(400);
  });
});

describe('the verifier', () => {
  test('reuses a positive check of a uid for a few seconds, then looks the account up again and sees its revocation', async () => {
    const standIn = new StandInAuth();
    const clock = new ManualClock();
    const verify = revocationCheckingVerifier(standIn, clock);
    await expect(verify('alice.1000')).resolves.toMatchObject({ uid: 'alice', signInProvider: 'password' });
    await verify('alice.1000');
    expect(standIn.lookups).toBe(1);

    standIn.revokedBefore.set('alice', 2_000);
    clock.advance(REVOCATION_CHECK_REUSE_MS - 1);
    await expect(verify('alice.1000')).resolves.toMatchObject({ uid: 'alice' });
    clock.advance(1);
    await expect(verify('alice.1000')).rejects.toThrow('revoked');
    expect(standIn.lookups).toBe(2);
  });

  test('a check passed by a later sign-in proves nothing for a token of an earlier one', async () => {
    const standIn = new StandInAuth();
    const verify = revocationCheckingVerifier(standIn, new ManualClock());
    standIn.revokedBefore.set('alice', 2_000);
    await verify('alice.3000');
    await expect(verify('alice.1000')).rejects.toThrow('revoked');
  });

  test('a refusal is not remembered: the account is looked up at every call until it passes', async () => {
    const standIn = new StandInAuth();
    const verify = revocationCheckingVerifier(standIn, new ManualClock());
    standIn.disabled.add('bob');
    await expect(verify('bob.1000')).rejects.toThrow('disabled');
    await expect(verify('bob.1000')).rejects.toThrow('disabled');
    standIn.disabled.delete('bob');
    await expect(verify('bob.1000')).resolves.toMatchObject({ uid: 'bob' });
    expect(standIn.lookups).toBe(3);
  });

  test('a malformed token is refused before any lookup', async () => {
    const standIn = new StandInAuth();
    await expect(revocationCheckingVerifier(standIn, new ManualClock())('not a token')).rejects.toThrow('Decoding');
    expect(standIn.lookups).toBe(0);
  });
});
