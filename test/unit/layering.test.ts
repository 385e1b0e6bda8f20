/**
 * The layering rules in eslint.config.mjs fire: small files that break them, linted in memory
 * through ESLint's Node API with the project's own configuration, get an error each, and files
 * that keep to them get none. ESLint loads its flat config with a dynamic import, which jest's
 * module system cannot run, so the lint runs in a child Node process.
 */
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';

const ROOT = join(__dirname, '..', '..');

interface Probe {
  readonly filePath: string;
  readonly text: string;
}

// Import rules need no type information, and the probe files exist only in memory, outside the
// TypeScript project: type-checked linting is switched off for them.
const LINT_IN_MEMORY = `
const { ESLint } = require('eslint');
const tseslint = require('typescript-eslint');
(async () => {
  const probes = JSON.parse(require('node:fs').readFileSync(0, 'utf8'));
  const eslint = new ESLint({ cwd: process.cwd(), overrideConfig: [tseslint.configs.disableTypeChecked] });
  const found = [];
  for (const probe of probes) {
    const [result] = await eslint.lintText(probe.text, { filePath: probe.filePath, warnIgnored: true });
    const layering = ['no-restricted-imports', '@typescript-eslint/no-restricted-imports', 'no-restricted-syntax'];
    found.push(result.messages.filter((m) => layering.includes(m.ruleId) || m.fatal).map((m) => (m.fatal ? 'fatal: ' : '') + m.message));
  }
  process.stdout.write(JSON.stringify(found));
})().catch((error) => { console.error(error); process.exit(1); });
`;

function lint(probes: readonly Probe[]): string[][] {
  const run = spawnSync(process.execPath, ['-e', LINT_IN_MEMORY], { cwd: ROOT, input: JSON.stringify(probes), encoding: 'utf8', timeout: 120_000 });
  if (run.status !== 0) throw new Error(`ESLint did not run: ${run.stderr}`);
  return JSON.parse(run.stdout) as string[][];
}

const ABOVE_CORE = ['engine', 'store', 'triggers', 'http', 'pipelines', 'providers', 'agent', 'effects', 'config'];

const probes = {
  coreFirebaseAdmin: { filePath: 'functions/src/core/probe.ts', text: "import { getFirestore } from 'firebase-admin/firestore';\nexport const probe = getFirestore;\n" },
  coreFirebaseFunctions: { filePath: 'functions/src/core/probe.ts', text: "import { logger } from 'firebase-functions';\nexport const probe = logger;\n" },
  coreGoogleCloud: { filePath: 'functions/src/core/probe.ts', text: "import { CloudTasksClient } from '@google-cloud/tasks';\nexport const probe = CloudTasksClient;\n" },
  coreAbove: {
    filePath: 'functions/src/core/probe.ts',
    text: ABOVE_CORE.map((folder, index) => `import type * as above${index} from '../${folder}/anything';\nexport type Above${index} = typeof above${index};\n`).join(''),
  },
  coreReexport: { filePath: 'functions/src/core/probe.ts', text: "export { runStep } from '../engine/step';\n" },
  coreAllowed: { filePath: 'functions/src/core/probe.ts', text: "import { z } from 'zod';\nimport { TerminalError } from './errors';\nexport const probe = [z, TerminalError];\n" },
  pipelineTriggers: { filePath: 'functions/src/pipelines/probe.ts', text: "import { firestore } from '../triggers/admin';\nexport const probe = firestore;\n" },
  nestedPipelineTriggers: { filePath: 'functions/src/pipelines/notify/probe.ts', text: "import { firestore } from '../../triggers/admin';\nexport const probe = firestore;\n" },
  pipelineAllowed: {
    filePath: 'functions/src/pipelines/probe.ts',
    text: "import type { Firestore } from 'firebase-admin/firestore';\nimport { firestoreCircuit } from '../store/provider-circuit';\nexport const probe = (db: Firestore) => firestoreCircuit(db, 'x');\n",
  },
  configTriggers: { filePath: 'functions/src/config/probe.ts', text: "import { firestore } from '../triggers/admin';\nexport const probe = firestore;\n" },
  engineFirestoreValue: { filePath: 'functions/src/engine/probe.ts', text: "import { getFirestore } from 'firebase-admin/firestore';\nexport const probe = getFirestore;\n" },
  engineFirestoreMixed: {
    filePath: 'functions/src/engine/step/probe.ts',
    text: "import { FieldValue, type Transaction } from 'firebase-admin/firestore';\nexport const probe = (tx: Transaction) => FieldValue.increment(tx ? 1 : 0);\n",
  },
  engineStoreDb: {
    filePath: 'functions/src/engine/step/probe.ts',
    text: "import type { JobStore } from '../../store/job-store';\nexport const probe = (store: JobStore) => store.db.collection('jobs');\n",
  },
  engineDestructuredDb: {
    filePath: 'functions/src/engine/probe.ts',
    text: "import type { JobStore } from '../store/job-store';\nexport const probe = ({ db }: JobStore) => db;\n",
  },
  engineAllowed: {
    filePath: 'functions/src/engine/probe.ts',
    text:
      "import type { Transaction } from 'firebase-admin/firestore';\nimport { readCheckpointDocuments } from '../store/checkpoint-reads';\nimport type { JobStore } from '../store/job-store';\n" +
      "export const probe = (store: JobStore, tx: Transaction) => [readCheckpointDocuments(store, 'j'), store.jobRef('j'), tx];\n",
  },
} satisfies Record<string, Probe>;

describe('layering rules', () => {
  let found: Record<keyof typeof probes, string[]>;
  beforeAll(() => {
    const names = Object.keys(probes) as (keyof typeof probes)[];
    const results = lint(names.map((name) => probes[name]));
    found = Object.fromEntries(names.map((name, index) => [name, results[index] ?? ['(no result)']])) as Record<keyof typeof probes, string[]>;
  }, 120_000);

  test('core/ imports no Firebase or Google Cloud package', () => {
    for (const probe of ['coreFirebaseAdmin', 'coreFirebaseFunctions', 'coreGoogleCloud'] as const) {
      expect(found[probe]).toEqual([expect.stringContaining('core/ imports no Firebase or Google Cloud package')]);
    }
  });

  test('core/ imports nothing from the folders above it, re-exports included', () => {
    expect(found.coreAbove).toEqual(ABOVE_CORE.map((): unknown => expect.stringContaining('core/ imports nothing above it')));
    expect(found.coreReexport).toEqual([expect.stringContaining('core/ imports nothing above it')]);
  });

  test('pipelines/ do not import triggers/, at any depth; config/ neither', () => {
    expect(found.pipelineTriggers).toEqual([expect.stringContaining('pipelines/ do not import triggers/')]);
    expect(found.nestedPipelineTriggers).toEqual([expect.stringContaining('pipelines/ do not import triggers/')]);
    expect(found.configTriggers).toEqual([expect.stringContaining('config/ sits below the code that reads it')]);
  });

  test('engine/ reaches Firestore only through the store: no Firestore value imported, no .db', () => {
    expect(found.engineFirestoreValue).toEqual([expect.stringContaining('engine/ reaches Firestore only through the store')]);
    expect(found.engineFirestoreMixed).toEqual([expect.stringContaining('engine/ reaches Firestore only through the store')]);
    expect(found.engineStoreDb).toEqual([expect.stringContaining("engine/ does not use the store's Firestore instance (.db)")]);
    expect(found.engineDestructuredDb).toEqual([expect.stringContaining("engine/ does not use the store's Firestore instance (.db)")]);
  });

  test('imports within the layering pass: core on zod and itself, pipelines on store and Firebase, the engine on the store and Firestore types', () => {
    expect(found.coreAllowed).toEqual([]);
    expect(found.pipelineAllowed).toEqual([]);
    expect(found.engineAllowed).toEqual([]);
  });
});
