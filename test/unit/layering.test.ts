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
// TypeScript project: type-checked linting is switched off for them. The child also reports the
// layer order the configuration declares (LAYER_ORDER, exported beside the default config).
const LINT_IN_MEMORY = `
const { ESLint } = require('eslint');
const tseslint = require('typescript-eslint');
const { pathToFileURL } = require('node:url');
(async () => {
  const probes = JSON.parse(require('node:fs').readFileSync(0, 'utf8'));
  const eslint = new ESLint({ cwd: process.cwd(), overrideConfig: [tseslint.configs.disableTypeChecked] });
  const found = [];
  for (const probe of probes) {
    const [result] = await eslint.lintText(probe.text, { filePath: probe.filePath, warnIgnored: true });
    const layering = ['no-restricted-imports', '@typescript-eslint/no-restricted-imports', 'no-restricted-syntax'];
    found.push(result.messages.filter((m) => layering.includes(m.ruleId) || m.fatal).map((m) => (m.fatal ? 'fatal: ' : '') + m.message));
  }
  const { LAYER_ORDER } = await import(pathToFileURL(require('node:path').join(process.cwd(), 'eslint.config.mjs')).href);
  process.stdout.write(JSON.stringify({ found, layers: LAYER_ORDER.map(([name]) => name) }));
})().catch((error) => { console.error(error); process.exit(1); });
`;

function lint(probes: readonly Probe[]): { found: string[][]; layers: string[] } {
  const run = spawnSync(process.execPath, ['-e', LINT_IN_MEMORY], { cwd: ROOT, input: JSON.stringify(probes), encoding: 'utf8', timeout: 120_000 });
  if (run.status !== 0) throw new Error(`ESLint did not run: ${run.stderr}`);
  return JSON.parse(run.stdout) as { found: string[][]; layers: string[] };
}

/** The layers of functions/src, bottom to top, as eslint.config.mjs declares them (checked below): a folder imports only those before it. */
const LAYERS = ['core', 'telemetry', 'store', 'effects', 'agent', 'providers', 'engine', 'config', 'http', 'triggers', 'api', 'pipelines'] as const;
type Layer = (typeof LAYERS)[number];

const importsOf = (prefix: string, folders: readonly string[]) =>
  folders.map((folder, index) => `import type * as layer${index} from '${prefix}${folder}/anything';\nexport type Layer${index} = typeof layer${index};\n`).join('');

/**
 * Per layer: a file directly in it and one a folder deeper, each importing every layer above it
 * (and the deploy entry), which must each be an error; the same files importing every layer below
 * and their own, which must pass; and a deeper file importing a subfolder of its own layer named
 * like a layer above, which is not that layer and must pass.
 */
const layerProbes = Object.fromEntries(
  LAYERS.flatMap((layer, position) => {
    const above = [...LAYERS.slice(position + 1), 'index'];
    const below = [...LAYERS.slice(0, position + 1)];
    const nearestAbove = LAYERS[position + 1] ?? 'index';
    return [
      [`${layer}:above`, { filePath: `functions/src/${layer}/probe.ts`, text: importsOf('../', above) }],
      [`${layer}:nested-above`, { filePath: `functions/src/${layer}/nested/probe.ts`, text: importsOf('../../', above) }],
      [`${layer}:below`, { filePath: `functions/src/${layer}/probe.ts`, text: importsOf('../', below) + importsOf('./', ['sibling']) }],
      [`${layer}:nested-below`, { filePath: `functions/src/${layer}/nested/probe.ts`, text: importsOf('../../', below) + importsOf('../', [nearestAbove]) }],
    ] as const;
  }),
) as Record<`${Layer}:${'above' | 'nested-above' | 'below' | 'nested-below'}`, Probe>;

const probes = {
  ...layerProbes,
  coreFirebaseAdmin: { filePath: 'functions/src/core/probe.ts', text: "import { getFirestore } from 'firebase-admin/firestore';\nexport const probe = getFirestore;\n" },
  coreFirebaseFunctions: { filePath: 'functions/src/core/probe.ts', text: "import { logger } from 'firebase-functions';\nexport const probe = logger;\n" },
  coreGoogleCloud: { filePath: 'functions/src/core/probe.ts', text: "import { CloudTasksClient } from '@google-cloud/tasks';\nexport const probe = CloudTasksClient;\n" },
  coreReexport: { filePath: 'functions/src/core/probe.ts', text: "export { runStep } from '../engine/step';\n" },
  coreAllowed: { filePath: 'functions/src/core/probe.ts', text: "import { z } from 'zod';\nimport { TerminalError } from './errors';\nexport const probe = [z, TerminalError];\n" },
  pipelineTriggers: { filePath: 'functions/src/pipelines/probe.ts', text: "import { firestore } from '../triggers/admin';\nexport const probe = firestore;\n" },
  nestedPipelineTriggers: { filePath: 'functions/src/pipelines/notify/probe.ts', text: "import { firestore } from '../../triggers/admin';\nexport const probe = firestore;\n" },
  pipelineApiFile: { filePath: 'functions/src/pipelines/probe.ts', text: "import { createPhaseline } from '../api/create-phaseline';\nexport const probe = createPhaseline;\n" },
  pipelinePackageName: { filePath: 'functions/src/pipelines/probe.ts', text: "import { definePipeline } from 'phaseline';\nexport const probe = definePipeline;\n" },
  pipelineAllowed: {
    filePath: 'functions/src/pipelines/probe.ts',
    text: "import type { Firestore } from 'firebase-admin/firestore';\nimport { firestoreCircuit } from '../api';\nimport { canaryPipeline } from './canary';\nexport const probe = (db: Firestore) => [firestoreCircuit(db, 'x'), canaryPipeline];\n",
  },
  nestedPipelineAllowed: {
    filePath: 'functions/src/pipelines/notify/probe.ts',
    text: "import { definePhase } from '../../api';\nimport { canaryPipeline } from '../canary';\nexport const probe = [definePhase, canaryPipeline];\n",
  },
  exampleInternals: { filePath: 'examples/probe.ts', text: "import { definePipeline } from '../functions/src/core/pipeline';\nexport const probe = definePipeline;\n" },
  exampleApiFolder: { filePath: 'examples/probe.ts', text: "import { definePipeline } from '../functions/src/api';\nexport const probe = definePipeline;\n" },
  examplePackageInternals: { filePath: 'examples/probe.ts', text: "import { definePipeline } from 'phaseline/lib/core/pipeline';\nexport const probe = definePipeline;\n" },
  nestedExampleInternals: { filePath: 'examples/nested/probe.ts', text: "import { runStep } from '../../functions/src/engine/step';\nexport const probe = runStep;\n" },
  exampleAllowed: { filePath: 'examples/probe.ts', text: "import { z } from 'zod';\nimport { definePipeline } from 'phaseline';\nimport { other } from './other';\nexport const probe = [z, definePipeline, other];\n" },
  nestedExampleAllowed: { filePath: 'examples/nested/probe.ts', text: "import { definePipeline } from 'phaseline';\nimport { other } from '../other';\nexport const probe = [definePipeline, other];\n" },
  storeEffectLedger: { filePath: 'functions/src/store/probe.ts', text: "import type { EffectLedger } from '../effects/ledger';\nexport type Probe = EffectLedger;\n" },
  storeAgentCircuit: { filePath: 'functions/src/store/probe.ts', text: "import { CLOSED_CIRCUIT } from '../agent/circuit';\nexport const probe = CLOSED_CIRCUIT;\n" },
  telemetryAgent: { filePath: 'functions/src/telemetry/probe.ts', text: "import type { ModelProvider } from '../agent/provider';\nexport type Probe = ModelProvider;\n" },
  telemetryConfig: { filePath: 'functions/src/telemetry/probe.ts', text: "import type { TracingConfig } from '../config/environment';\nexport type Probe = TracingConfig;\n" },
  engineDeployedPipelines: { filePath: 'functions/src/engine/probe.ts', text: "import { deployedPipelines } from '../pipelines';\nexport const probe = deployedPipelines;\n" },
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
  let declaredLayers: string[];
  beforeAll(() => {
    const names = Object.keys(probes) as (keyof typeof probes)[];
    const results = lint(names.map((name) => probes[name]));
    found = Object.fromEntries(names.map((name, index) => [name, results.found[index] ?? ['(no result)']])) as Record<keyof typeof probes, string[]>;
    declaredLayers = results.layers;
  }, 120_000);

  test('eslint.config.mjs declares the layer order these probes hold it to', () => {
    expect(declaredLayers).toEqual([...LAYERS]);
  });

  test.each(LAYERS.map((layer, position) => ({ layer, above: [...LAYERS.slice(position + 1), 'index'] })))(
    '$layer/ imports no layer above it (nor the deploy entry), from any depth, type imports included',
    ({ layer, above }) => {
      // From pipelines/ an import of the deploy entry also leaves the public API, and is refused for both.
      const alsoOutsideApi: unknown[] = layer === 'pipelines' ? [expect.stringContaining('pipelines/ import only the public API')] : [];
      const upward = above.flatMap((): unknown[] => [...alsoOutsideApi, expect.stringContaining(`${layer}/ imports nothing above it in the layers`)]);
      expect(found[`${layer}:above`]).toEqual(upward);
      expect(found[`${layer}:nested-above`]).toEqual(upward);
    },
  );

  test.each(LAYERS.filter((layer) => layer !== 'pipelines'))('%s/ imports the layers below it and its own folder, and a subfolder of its own named like a layer above', (layer) => {
    expect(found[`${layer}:below`]).toEqual([]);
    expect(found[`${layer}:nested-below`]).toEqual([]);
  });

  test("pipelines/ import only the public API: any other file of functions/src is refused, api/'s index and their own folder pass", () => {
    const publicApiOnly: unknown = expect.stringContaining('pipelines/ import only the public API');
    // The probes import a file inside every layer below (api/'s too: only its index is public), then a file of their own folder, which passes.
    expect(found['pipelines:below']).toEqual(LAYERS.map(() => publicApiOnly));
    expect(found['pipelines:nested-below']).toEqual(LAYERS.map(() => publicApiOnly));
    for (const probe of ['pipelineTriggers', 'nestedPipelineTriggers', 'pipelineApiFile', 'pipelinePackageName'] as const) expect(found[probe]).toEqual([publicApiOnly]);
    expect(found.pipelineAllowed).toEqual([]);
    expect(found.nestedPipelineAllowed).toEqual([]);
  });

  test("examples/ import only the package 'phaseline' and their own files", () => {
    const publicApiOnly: unknown = expect.stringContaining("examples/ import only the public API, as the package 'phaseline'");
    for (const probe of ['exampleInternals', 'exampleApiFolder', 'examplePackageInternals', 'nestedExampleInternals'] as const) expect(found[probe]).toEqual([publicApiOnly]);
    expect(found.exampleAllowed).toEqual([]);
    expect(found.nestedExampleAllowed).toEqual([]);
  });

  test('core/ imports no Firebase or Google Cloud package', () => {
    for (const probe of ['coreFirebaseAdmin', 'coreFirebaseFunctions', 'coreGoogleCloud'] as const) {
      expect(found[probe]).toEqual([expect.stringContaining('core/ imports no Firebase or Google Cloud package')]);
    }
  });

  test('a re-export counts as an import', () => {
    expect(found.coreReexport).toEqual([expect.stringContaining('core/ imports nothing above it')]);
  });

  test('the moves that broke the order would each be refused: the store on effects/ and agent/, telemetry on agent/ and config/, the engine on pipelines/', () => {
    expect(found.storeEffectLedger).toEqual([expect.stringContaining('store/ imports nothing above it')]);
    expect(found.storeAgentCircuit).toEqual([expect.stringContaining('store/ imports nothing above it')]);
    expect(found.telemetryAgent).toEqual([expect.stringContaining('telemetry/ imports nothing above it')]);
    expect(found.telemetryConfig).toEqual([expect.stringContaining('telemetry/ imports nothing above it')]);
    expect(found.engineDeployedPipelines).toEqual([expect.stringContaining('engine/ imports nothing above it')]);
    expect(found.configTriggers).toEqual([expect.stringContaining('config/ imports nothing above it')]);
  });

  test('engine/ reaches Firestore only through the store: no Firestore value imported, no .db', () => {
    expect(found.engineFirestoreValue).toEqual([expect.stringContaining('engine/ reaches Firestore only through the store')]);
    expect(found.engineFirestoreMixed).toEqual([expect.stringContaining('engine/ reaches Firestore only through the store')]);
    expect(found.engineStoreDb).toEqual([expect.stringContaining("engine/ does not use the store's Firestore instance (.db)")]);
    expect(found.engineDestructuredDb).toEqual([expect.stringContaining("engine/ does not use the store's Firestore instance (.db)")]);
  });

  test('imports within the layering pass: core on zod and itself, the engine on the store and Firestore types', () => {
    expect(found.coreAllowed).toEqual([]);
    expect(found.engineAllowed).toEqual([]);
  });
});
