/** Addresses of firebase-tools' emulators, read from the hub that `emulators:exec` announces. */
interface EmulatorInfo {
  host: string;
  port: number;
}

export const E2E_PROJECT_ID = 'demo-phaseline';
export const REGION = 'us-central1';

/** `hub`: another emulator suite's hub (a project started by a test), else the one the e2e layer runs under. */
export async function emulatorAddress(name: 'functions' | 'tasks' | 'auth', hub = process.env.FIREBASE_EMULATOR_HUB): Promise<string> {
  if (!hub) throw new Error('FIREBASE_EMULATOR_HUB is not set: run the e2e layer with `npm run test:e2e`.');
  const listing = (await (await fetch(`http://${hub}/emulators`)).json()) as Record<string, EmulatorInfo | undefined>;
  const info = listing[name];
  if (!info) throw new Error(`The ${name} emulator is not running (hub lists: ${Object.keys(listing).join(', ')}).`);
  return `${info.host}:${info.port}`;
}

export async function functionUrl(name: string, project?: { readonly id: string; readonly hub: string }): Promise<string> {
  return `http://${await emulatorAddress('functions', project?.hub)}/${project?.id ?? E2E_PROJECT_ID}/${REGION}/${name}`;
}

/** Signs in anonymously on the Auth emulator and returns the ID token and uid. */
export async function anonymousUser(hub?: string): Promise<{ idToken: string; uid: string }> {
  const auth = await emulatorAddress('auth', hub);
  const response = await fetch(`http://${auth}/identitytoolkit.googleapis.com/v1/accounts:signUp?key=demo-key`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ returnSecureToken: true }),
  });
  if (!response.ok) throw new Error(`Anonymous sign-up failed: ${response.status} ${await response.text()}`);
  const body = (await response.json()) as { idToken: string; localId: string };
  return { idToken: body.idToken, uid: body.localId };
}
