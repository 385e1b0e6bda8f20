import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CliError, UsageError } from '../../scripts/cli/errors';
import { identityFile, identitySource, uidOfToken } from '../../scripts/cli/identity';
import { emulatorHostsFrom, readEmulatorHosts, resolveTarget, type LocalTarget } from '../../scripts/cli/target';

const token = (claims: object) => `${Buffer.from('{"alg":"none"}').toString('base64url')}.${Buffer.from(JSON.stringify(claims)).toString('base64url')}.`;

describe('target', () => {
  test('by default the local stack on firebase.json\'s ports', () => {
    expect(resolveTarget({}, {})).toEqual({
      kind: 'local',
      projectId: 'demo-phaseline',
      region: 'us-central1',
      hosts: { firestore: '127.0.0.1:8080', functions: '127.0.0.1:5001', auth: '127.0.0.1:9099', tasks: '127.0.0.1:9499' },
      firestoreUrl: 'http://127.0.0.1:8080/v1',
      functionsUrl: 'http://127.0.0.1:5001/demo-phaseline/us-central1',
    });
  });

  test('the emulator variables move the emulators; a demo- project stays local', () => {
    const target = resolveTarget({ project: 'demo-other' }, { FIRESTORE_EMULATOR_HOST: '127.0.0.1:18080', FIREBASE_AUTH_EMULATOR_HOST: 'localhost:19099', CLOUD_TASKS_EMULATOR_HOST: '127.0.0.1:19499' }) as LocalTarget;
    expect(target.hosts).toEqual({ firestore: '127.0.0.1:18080', functions: '127.0.0.1:5001', auth: 'localhost:19099', tasks: '127.0.0.1:19499' });
    expect(target.functionsUrl).toBe('http://127.0.0.1:5001/demo-other/us-central1');
  });

  test('any other project is deployed; --project beats PHASELINE_PROJECT; the region and the functions URL can be set', () => {
    expect(resolveTarget({}, { PHASELINE_PROJECT: 'acme-prod', PHASELINE_REGION: 'europe-west1' })).toEqual({
      kind: 'deployed',
      projectId: 'acme-prod',
      region: 'europe-west1',
      firestoreUrl: 'https://firestore.googleapis.com/v1',
      functionsUrl: 'https://europe-west1-acme-prod.cloudfunctions.net',
    });
    expect(resolveTarget({ project: 'acme-staging' }, { PHASELINE_PROJECT: 'acme-prod', PHASELINE_FUNCTIONS_URL: 'https://api.example.test/fn/' })).toMatchObject({
      projectId: 'acme-staging',
      functionsUrl: 'https://api.example.test/fn',
    });
  });

  test('a deployed project with an emulator variable set is refused rather than silently mixed', () => {
    expect(() => resolveTarget({ project: 'acme-prod' }, { FIRESTORE_EMULATOR_HOST: '127.0.0.1:8080' })).toThrow(
      new CliError('FIRESTORE_EMULATOR_HOST is set, but acme-prod is a deployed project: unset them to act on it, or use a demo- project for the emulators'),
    );
  });

  test.each([['Acme'], ['a'], ['acme_prod'], ['acme-']])('project ID %s is refused', (project) => {
    expect(() => resolveTarget({ project }, {})).toThrow(UsageError);
  });

  test('a region must look like one', () => {
    expect(() => resolveTarget({ region: 'mars' }, {})).toThrow(/not a Cloud Functions region/);
  });

  test('firebase.json ports, with firebase-tools\' defaults for what it leaves out', () => {
    expect(readEmulatorHosts()).toEqual({ firestore: '127.0.0.1:8080', functions: '127.0.0.1:5001', auth: '127.0.0.1:9099', tasks: '127.0.0.1:9499' });
    expect(emulatorHostsFrom({ emulators: { firestore: { host: 'localhost', port: 8181 } } })).toEqual({
      firestore: 'localhost:8181',
      functions: '127.0.0.1:5001',
      auth: '127.0.0.1:9099',
      tasks: '127.0.0.1:9499',
    });
    expect(readEmulatorHosts('/no/such/firebase.json').firestore).toBe('127.0.0.1:8080');
  });
});

describe('identity', () => {
  let home: string;
  beforeEach(() => {
    home = mkdtempSync(join(tmpdir(), 'phaseline-cli-'));
  });
  afterEach(() => rmSync(home, { recursive: true, force: true }));

  function authEmulator(answer: (body: { token: string }) => Response | Promise<Response>) {
    const calls: { url: string; body: { token: string; returnSecureToken: boolean } }[] = [];
    const fetchFn = (async (url: string | URL | Request, init?: RequestInit) => {
      const body = JSON.parse(typeof init?.body === 'string' ? init.body : '{}') as { token: string; returnSecureToken: boolean };
      calls.push({ url: typeof url === 'string' ? url : url instanceof URL ? url.href : url.url, body });
      return answer(body);
    }) as typeof fetch;
    return { fetchFn, calls };
  }

  test('locally: a custom-token user on the Auth emulator, whose uid is kept so later runs act as the same owner', async () => {
    const { fetchFn, calls } = authEmulator((body) => Response.json({ idToken: `id-token-for-${(JSON.parse(body.token) as { uid: string }).uid}` }));
    const target = resolveTarget({}, {});
    const env = { PHASELINE_HOME: home };

    const first = await identitySource(target, { env, fetch: fetchFn })();
    expect(first.uid).toMatch(/^cli-[0-9a-f]{16}$/);
    expect(first.idToken).toBe(`id-token-for-${first.uid}`);
    expect(calls[0]).toEqual({
      url: 'http://127.0.0.1:9099/identitytoolkit.googleapis.com/v1/accounts:signInWithCustomToken?key=phaseline-cli',
      body: { token: JSON.stringify({ uid: first.uid }), returnSecureToken: true },
    });
    expect(JSON.parse(readFileSync(identityFile(env, 'demo-phaseline'), 'utf8'))).toMatchObject({ uid: first.uid });

    const second = await identitySource(target, { env, fetch: fetchFn })();
    expect(second.uid).toBe(first.uid);
    expect(calls).toHaveLength(2);
    // Another project, another user.
    const other = await identitySource(resolveTarget({ project: 'demo-other' }, {}), { env, fetch: fetchFn })();
    expect(other.uid).not.toBe(first.uid);
  });

  test('one sign-in per process, however many times the identity is asked for', async () => {
    const { fetchFn, calls } = authEmulator(() => Response.json({ idToken: 't' }));
    const source = identitySource(resolveTarget({}, {}), { env: { PHASELINE_HOME: home }, fetch: fetchFn });
    await Promise.all([source(), source(), source()]);
    expect(calls).toHaveLength(1);
  });

  test('a local token is renewed five minutes before it expires, as the same user', async () => {
    const { fetchFn, calls } = authEmulator(() => Response.json({ idToken: `t${calls.length}`, expiresIn: '3600' }));
    let nowMs = 1_000_000;
    const source = identitySource(resolveTarget({}, {}), { env: { PHASELINE_HOME: home }, fetch: fetchFn, now: () => nowMs });
    const first = await source();
    nowMs += 54 * 60_000;
    expect(await source()).toEqual(first);
    nowMs += 60_000;
    const renewed = await source();
    expect(renewed).toEqual({ uid: first.uid, idToken: 't2' });
    expect(calls).toHaveLength(2);
  });

  test('the Auth emulator not running is said plainly', async () => {
    const refused = (() => Promise.reject(new TypeError('fetch failed', { cause: { code: 'ECONNREFUSED' } }))) as typeof fetch;
    await expect(identitySource(resolveTarget({}, {}), { env: { PHASELINE_HOME: home }, fetch: refused })()).rejects.toThrow(
      new CliError('Could not reach the Auth emulator at 127.0.0.1:9099 (connection refused). Is the local stack running? Start it with `npm start`.'),
    );
  });

  test('the Auth emulator refusing is reported with its answer', async () => {
    const { fetchFn } = authEmulator(() => new Response('{"error":{"message":"INVALID_CUSTOM_TOKEN"}}', { status: 400 }));
    await expect(identitySource(resolveTarget({}, {}), { env: { PHASELINE_HOME: home }, fetch: fetchFn })()).rejects.toThrow(/failed \(400\): .*INVALID_CUSTOM_TOKEN/);
  });

  test('PHASELINE_ID_TOKEN is used as it is, locally or deployed, its uid read from the token', async () => {
    const given = token({ user_id: 'u-42', sub: 'u-42' });
    const never = (() => Promise.reject(new Error('no sign-in expected'))) as typeof fetch;
    for (const target of [resolveTarget({}, {}), resolveTarget({ project: 'acme-prod' }, {})]) {
      expect(await identitySource(target, { env: { PHASELINE_ID_TOKEN: given }, fetch: never })()).toEqual({ uid: 'u-42', idToken: given });
    }
    expect(uidOfToken(token({ sub: 'only-sub' }))).toBe('only-sub');
    expect(() => uidOfToken('not-a-jwt')).toThrow(/does not hold a Firebase ID token/);
    expect(() => uidOfToken(token({ aud: 'x' }))).toThrow(/does not hold a Firebase ID token/);
  });

  test('a deployed project without PHASELINE_ID_TOKEN says what to set', async () => {
    await expect(identitySource(resolveTarget({ project: 'acme-prod' }, {}), { env: {} })()).rejects.toThrow(/^Set PHASELINE_ID_TOKEN to a Firebase ID token of the user to act as on acme-prod/);
  });
});
