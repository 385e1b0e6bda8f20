/**
 * firestore.rules on the emulator, for the rules tests: test environments in this worker's own
 * projects (the deployed rules, or a loosened copy), seeded before each test, cleaned up after the
 * file, and a client as a given user.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { assertFails, assertSucceeds, initializeTestEnvironment, type RulesTestEnvironment, type TokenOptions } from '@firebase/rules-unit-testing';
import { setLogLevel, type Firestore } from 'firebase/firestore';

export const RULES = readFileSync(join(__dirname, '..', '..', 'firestore.rules'), 'utf8');

function emulator(): { host: string; port: number } {
  const address = process.env.FIRESTORE_EMULATOR_HOST;
  if (!address) throw new Error('FIRESTORE_EMULATOR_HOST is not set: the emulator layer starts it in its global setup.');
  const [host = '', port = ''] = address.split(':');
  return { host, port: Number(port) };
}

export interface RulesSuite {
  /** Another environment (a loosened copy of the rules, say), cleaned up with the rest. */
  readonly environment: (label: string, rules: string) => Promise<RulesTestEnvironment>;
  /**
   * Loads the rules with `from` replaced by `to` and shows that `probe` catches it: allowed by the
   * loosened copy (so the probe's own assertFails would fail there), refused by the real rules.
   */
  readonly catchesLoosening: (loosening: Loosening) => Promise<void>;
}

export interface Loosening {
  readonly label: string;
  /** What the loosening lets through, as the test's title. */
  readonly what: string;
  readonly from: string;
  readonly to: string;
  readonly probe: (env: RulesTestEnvironment) => Promise<unknown>;
}

/** The deployed rules in an environment of `label`'s, handed to `ready` once; `seed` runs before each test. */
export function rulesSuite(label: string, seed: (env: RulesTestEnvironment) => Promise<void>, ready: (env: RulesTestEnvironment) => void): RulesSuite {
  const worker = process.env.JEST_WORKER_ID ?? '0';
  const environments: RulesTestEnvironment[] = [];
  let main: RulesTestEnvironment | undefined;
  const environment = async (name: string, rules: string): Promise<RulesTestEnvironment> => {
    const created = await initializeTestEnvironment({ projectId: `demo-${name}-${worker}`, firestore: { ...emulator(), rules } });
    environments.push(created);
    return created;
  };
  beforeAll(async () => {
    // Denied writes are what these tests expect; the SDK would log each one as a warning.
    setLogLevel('error');
    main = await environment(label, RULES);
    ready(main);
  });
  beforeEach(async () => {
    if (!main) throw new Error('the rules environment did not start');
    await seed(main);
  });
  afterAll(async () => {
    for (const created of environments) await created.cleanup();
  });
  const catchesLoosening = async ({ label: name, from, to, probe }: Loosening): Promise<void> => {
    if (!main) throw new Error('the rules environment did not start');
    expect(RULES).toContain(from);
    const loose = await environment(name, RULES.replace(from, to));
    await seed(loose);
    await assertSucceeds(probe(loose));
    await expect(assertFails(probe(loose))).rejects.toThrow();
    // And the real rules still refuse the same call.
    await assertFails(probe(main));
  };
  return { environment, catchesLoosening };
}

/** The context's Firestore (a compat instance, which the modular functions accept) as `uid` with these token claims, or signed out. */
export const as = (env: RulesTestEnvironment, uid: string | null, claims: TokenOptions = {}): Firestore =>
  (uid === null ? env.unauthenticatedContext() : env.authenticatedContext(uid, claims)).firestore() as unknown as Firestore;
