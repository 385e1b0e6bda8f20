/**
 * Who the user commands act as.
 *
 * - `PHASELINE_ID_TOKEN` set: that Firebase ID token (needed for a deployed project; its uid is read
 *   from the token).
 * - Locally otherwise: a custom-token user on the Auth emulator. Its uid is kept in a small file
 *   (`~/.phaseline/<project>.identity.json`, or under PHASELINE_HOME), and each run signs in as
 *   that uid, so `submit`, then `watch` or `cancel`, act as the same owner, also after the
 *   emulator restarted (the emulator accepts unsigned custom tokens; a real project never does).
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { CliError, connectionProblem } from './errors';
import { ENV, type Target } from './target';

export interface UserIdentity {
  readonly uid: string;
  readonly idToken: string;
}

export type IdentitySource = () => Promise<UserIdentity>;

export interface IdentityDeps {
  readonly env: NodeJS.ProcessEnv;
  readonly fetch?: typeof fetch;
  /** The clock that decides when a local token is renewed. */
  readonly now?: () => number;
}

/** The uid a Firebase ID token names (`user_id`, else `sub`); its signature is the server's business. */
export function uidOfToken(token: string): string {
  const payload = token.split('.')[1];
  if (payload !== undefined) {
    try {
      const claims = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as { user_id?: unknown; sub?: unknown };
      const uid = typeof claims.user_id === 'string' ? claims.user_id : claims.sub;
      if (typeof uid === 'string' && uid !== '') return uid;
    } catch {
      // Reported below.
    }
  }
  throw new CliError(`${ENV.idToken} does not hold a Firebase ID token (a JWT naming a user)`);
}

export function identityHome(env: NodeJS.ProcessEnv): string {
  const configured = env[ENV.home]?.trim();
  return configured ? configured : join(homedir(), '.phaseline');
}

export function identityFile(env: NodeJS.ProcessEnv, projectId: string): string {
  return join(identityHome(env), `${projectId}.identity.json`);
}

/** The uid kept for this project, created (and written) on first use. */
export function localUid(env: NodeJS.ProcessEnv, projectId: string): string {
  const file = identityFile(env, projectId);
  try {
    const stored = JSON.parse(readFileSync(file, 'utf8')) as { uid?: unknown };
    if (typeof stored.uid === 'string' && /^[A-Za-z0-9_-]{1,128}$/.test(stored.uid)) return stored.uid;
  } catch {
    // Missing or unreadable: a new identity.
  }
  const uid = `cli-${randomBytes(8).toString('hex')}`;
  try {
    mkdirSync(identityHome(env), { recursive: true });
    writeFileSync(file, `${JSON.stringify({ uid, note: 'The Phaseline CLI acts as this user on the local Auth emulator.' }, null, 2)}\n`, { mode: 0o600 });
  } catch (error) {
    throw new CliError(`Could not keep the local identity in ${file}: ${error instanceof Error ? error.message : String(error)} (set ${ENV.home} to a writable folder)`);
  }
  return uid;
}

interface SignedIn {
  readonly idToken: string;
  readonly expiresInSeconds: number;
}

async function signInOnAuthEmulator(authHost: string, uid: string, doFetch: typeof fetch): Promise<SignedIn> {
  // The Auth emulator takes a plain JSON object as an (unsigned) custom token.
  const url = `http://${authHost}/identitytoolkit.googleapis.com/v1/accounts:signInWithCustomToken?key=phaseline-cli`;
  let response: Response;
  try {
    response = await doFetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ token: JSON.stringify({ uid }), returnSecureToken: true }),
      signal: AbortSignal.timeout(10_000),
    });
  } catch (error) {
    throw new CliError(`Could not reach the Auth emulator at ${authHost} (${connectionProblem(error)}). Is the local stack running? Start it with \`npm start\`.`);
  }
  const text = await response.text();
  if (!response.ok) throw new CliError(`Signing in on the Auth emulator at ${authHost} failed (${response.status}): ${text.slice(0, 300)}`);
  const body = JSON.parse(text) as { idToken?: unknown; expiresIn?: unknown };
  if (typeof body.idToken !== 'string') throw new CliError(`The Auth emulator at ${authHost} answered without an ID token`);
  const expiresInSeconds = Number(body.expiresIn);
  return { idToken: body.idToken, expiresInSeconds: Number.isFinite(expiresInSeconds) && expiresInSeconds > 0 ? expiresInSeconds : 3_600 };
}

/** A local token is renewed this long before it expires (a watch can outlast the hour a token lives). */
export const TOKEN_RENEWAL_MARGIN_MS = 5 * 60_000;

/**
 * Resolves the identity on first use (commands that need no user never sign in), then reuses it;
 * a local sign-in is renewed shortly before its token expires.
 */
export function identitySource(target: Target, deps: IdentityDeps): IdentitySource {
  const now = deps.now ?? Date.now;
  let pending: Promise<UserIdentity & { readonly renewAtMs: number }> | undefined;
  const resolve = async (): Promise<UserIdentity & { readonly renewAtMs: number }> => {
    const token = deps.env[ENV.idToken]?.trim();
    if (token) return { uid: uidOfToken(token), idToken: token, renewAtMs: Number.POSITIVE_INFINITY };
    if (target.kind === 'deployed') {
      throw new CliError(
        `Set ${ENV.idToken} to a Firebase ID token of the user to act as on ${target.projectId} ` +
          '(a signed-in client gets one with getIdToken(); it lasts an hour).',
      );
    }
    const uid = localUid(deps.env, target.projectId);
    const startedMs = now();
    const signedIn = await signInOnAuthEmulator(target.hosts.auth, uid, deps.fetch ?? fetch);
    return { uid, idToken: signedIn.idToken, renewAtMs: startedMs + signedIn.expiresInSeconds * 1000 - TOKEN_RENEWAL_MARGIN_MS };
  };
  return async () => {
    pending ??= resolve();
    let current = await pending;
    if (now() >= current.renewAtMs) {
      pending = resolve();
      current = await pending;
    }
    return { uid: current.uid, idToken: current.idToken };
  };
}
