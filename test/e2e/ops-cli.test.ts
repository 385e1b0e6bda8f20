/**
 * `phaseline admin grant|revoke <uid>` against the Auth emulator this layer runs under: the claim
 * the console and `opsAction` check is set and cleared, the user's other claims are kept, a revoke
 * signs the user out (an operator's token is refused at once), and an unknown user or a malformed
 * command is refused with a sentence.
 */
import { randomUUID } from 'node:crypto';
import { deleteApp, initializeApp, type App } from 'firebase-admin/app';
import { getAuth } from 'firebase-admin/auth';
import { parseInvocation } from '../../scripts/cli/args';
import { bufferedIo } from '../../scripts/cli/io';
import { run } from '../../scripts/cli/main';
import { E2E_PROJECT_ID } from '../support/emulators';
import { setClaims, useAuthEmulator } from '../support/operators';

let admin: App;
let env: NodeJS.ProcessEnv;

beforeAll(async () => {
  env = { ...process.env, FIREBASE_AUTH_EMULATOR_HOST: await useAuthEmulator(), PHASELINE_PROJECT: E2E_PROJECT_ID };
  admin = initializeApp({ projectId: E2E_PROJECT_ID }, `ops-cli-${process.pid}`);
});

afterAll(async () => {
  await deleteApp(admin);
});

const claimsOf = async (uid: string) => (await getAuth(admin).getUser(uid)).customClaims ?? {};

test('grant sets admin: true and keeps other claims; revoke removes it, keeps the others and revokes the sessions', async () => {
  const uid = `ops-cli-${randomUUID().slice(0, 8)}`;
  await setClaims(admin, uid, { team: 'blue' });

  const granted = bufferedIo();
  expect(await run(['admin', 'grant', uid], granted, env)).toBe(0);
  expect(granted.stdout).toEqual([`User ${uid} is an operator now (custom claim admin: true).`]);
  expect(await claimsOf(uid)).toEqual({ team: 'blue', admin: true });

  const before = (await getAuth(admin).getUser(uid)).tokensValidAfterTime;
  await new Promise((resolve) => setTimeout(resolve, 1_100));
  const revoked = bufferedIo();
  expect(await run(['admin', 'revoke', uid], revoked, env)).toBe(0);
  expect(revoked.stdout).toEqual([`User ${uid} is no longer an operator; their sessions were signed out.`]);
  expect(await claimsOf(uid)).toEqual({ team: 'blue' });
  expect((await getAuth(admin).getUser(uid)).tokensValidAfterTime).not.toBe(before);
});

test('an unknown user is refused with exit 1 and a sentence; a malformed command is a usage error', async () => {
  const io = bufferedIo();
  expect(await run(['admin', 'grant', 'no-such-user-anywhere'], io, env)).toBe(1);
  expect(io.stderr[0]).toMatch(/^phaseline: There is no user no-such-user-anywhere on the local stack/);
  expect(() => parseInvocation(['admin', 'promote', 'x'])).toThrow(/admin needs grant or revoke and a user ID/);
  expect(() => parseInvocation(['admin', 'grant'])).toThrow(/admin needs grant or revoke/);
  expect(() => parseInvocation(['admin', 'grant', 'a/b'])).toThrow(/is not a user ID/);
  expect(parseInvocation(['admin', 'grant', 'uid-1']).command).toEqual({ name: 'admin', action: 'grant', uid: 'uid-1' });
});
