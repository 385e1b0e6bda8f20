// @ts-check
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

/**
 * The layers of functions/src, bottom to top: a folder imports only the folders before it in this
 * list (and itself), never one after it; the deploy entry functions/src/index.ts sits above them
 * all. test/unit/import-graph.test.ts checks every import, type imports included, against this same
 * list, and finds no cycle. engine/ and config/ import neither the other, nor do effects/ and
 * agent/, so their places relative to each other are a choice.
 * core/ is the pure centre. telemetry/ observes and is called, it does not call. store/ is
 * every Firestore access (a handle at its bottom, JobStore on top). effects/ is the external
 * effects protocol over the store's ledger; agent/ the model and tool toolkit, providers/ its model
 * backends; engine/ runs steps on the store; config/ reads the environment into options for the
 * toolkit and the engine; http/ the handlers; triggers/ bind them to Cloud Functions, built from
 * the pipelines handed in; api/ is the public face (its factory builds the triggers, so it sits
 * above them); pipelines/ are user code like any project's, written against api/ alone (see
 * PUBLIC_API below). Each folder's reason is the message its rule gives.
 */
export const LAYER_ORDER = /** @type {const} */ ([
  ['core', 'the pure centre, tested without an emulator: move what it needs down into core/.'],
  ['telemetry', 'it sits below the code it observes: it is called, it does not call.'],
  ['store', 'move the interface it implements down (into core/, as pure types), or the implementation up.'],
  ['effects', 'the protocol takes the store and its adapters; what it needs from above comes in as a port.'],
  ['agent', 'the toolkit is handed its providers and settings: take them as parameters.'],
  ['providers', 'a model backend implements the agent\'s ports and is handed its settings.'],
  ['engine', 'the engine is handed its pipelines and backends by the triggers.'],
  ['config', 'it sits below the code that reads it (http/, triggers/, pipelines/).'],
  ['http', 'handlers are mounted by the triggers: take what they need as parameters.'],
  ['triggers', 'triggers are built from the pipelines the public factory hands them (api/create-phaseline.ts): take them as parameters.'],
  ['api', 'the public API is what pipelines import: it never imports one.'],
  ['pipelines', 'only the deploy entry (functions/src/index.ts) sits above the pipelines.'],
]);

/**
 * Pipelines (functions/src/pipelines/, examples/) are written as any project writes them: against
 * the public API alone, so what this repository's own pipelines need is what the package exports.
 */
const PUBLIC_API_MESSAGE = {
  pipelines: 'pipelines/ import only the public API (\'../api\', functions/src/api/index.ts), as any project does: export what is missing from there.',
  examples: 'examples/ import only the public API, as the package \'phaseline\': export what is missing from functions/src/api/index.ts.',
};

/** The deepest folder nesting under a layer that its rule covers (test/unit/import-graph.test.ts covers every depth). */
const MAX_DEPTH = 4;

const FIREBASE_PACKAGES = '^(firebase-admin|firebase-functions|firebase|@firebase/[^/]+|@google-cloud/[^/]+)(/|$)';

/** Patterns a layer forbids besides the layers above it, for a file `depth` folders below functions/src. */
const EXTRA_PATTERNS = /** @type {Record<string, (depth: number) => { regex: string, message: string }[]>} */ ({
  core: () => [{ regex: FIREBASE_PACKAGES, message: 'core/ imports no Firebase or Google Cloud package: it is tested without an emulator.' }],
  telemetry: () => [{ regex: FIREBASE_PACKAGES, message: 'telemetry/ imports no Firebase package: the store and triggers call it.' }],
  // Out of pipelines/ only to api/'s index; the package name is for code outside functions/src.
  pipelines: (depth) => [
    { regex: `^(\\.\\./){${depth}}(?!api$)`, message: PUBLIC_API_MESSAGE.pipelines },
    { regex: '^phaseline(/|$)', message: PUBLIC_API_MESSAGE.pipelines },
  ],
});

/**
 * One rule per layer and depth: from a file `depth` folders below functions/src, `../` taken
 * `depth` times reaches functions/src, so the pattern names a layer, not a subfolder of the same
 * name nearer by. `index` at that level is the deploy entry.
 */
const layering = LAYER_ORDER.flatMap(([layer, reason], position) => {
  const above = [...LAYER_ORDER.slice(position + 1).map(([name]) => name), 'index'];
  const order = LAYER_ORDER.map(([name]) => name).join(' < ');
  return Array.from({ length: MAX_DEPTH }, (_, index) => {
    const depth = index + 1;
    return {
      files: [`functions/src/${layer}/${'*/'.repeat(depth - 1)}*.ts`],
      rules: {
        'no-restricted-imports': [
          'error',
          {
            patterns: [
              ...(EXTRA_PATTERNS[layer]?.(depth) ?? []),
              { regex: `^(\\.\\./){${depth}}(${above.join('|')})(/|$)`, message: `${layer}/ imports nothing above it in the layers (${order}): ${reason}` },
            ],
          },
        ],
      },
    };
  });
});

/**
 * engine/ talks to Firestore only through store/: no Firestore instance, no Firestore values
 * (FieldValue, Timestamp, FieldPath, getFirestore); types for signatures only.
 */
const engineThroughStore = {
  files: ['functions/src/engine/**/*.ts'],
  rules: {
    '@typescript-eslint/no-restricted-imports': [
      'error',
      {
        paths: [
          {
            name: 'firebase-admin/firestore',
            allowTypeImports: true,
            message: 'engine/ reaches Firestore only through the store: move the Firestore access into functions/src/store/ (type-only imports are allowed).',
          },
        ],
      },
    ],
    'no-restricted-syntax': [
      'error',
      {
        selector: "MemberExpression[property.name='db']",
        message: 'engine/ does not use the store\'s Firestore instance (.db): add the access to functions/src/store/ and call it through the JobStore.',
      },
      {
        selector: "ObjectPattern > Property[key.name='db']",
        message: 'engine/ does not use the store\'s Firestore instance (.db): add the access to functions/src/store/ and call it through the JobStore.',
      },
    ],
  },
};

/** examples/ import the package `phaseline` (its index only) and their own files, nothing else of the repository. */
const examplesThroughPublicApi = Array.from({ length: MAX_DEPTH }, (_, index) => ({
  files: [`examples/${'*/'.repeat(index)}*.ts`],
  rules: {
    'no-restricted-imports': [
      'error',
      {
        patterns: [
          { regex: `^(\\.\\./){${index + 1}}`, message: PUBLIC_API_MESSAGE.examples },
          { regex: '^phaseline/', message: PUBLIC_API_MESSAGE.examples },
        ],
      },
    ],
  },
}));

export default tseslint.config(
  // The outside project is compiled in its own folder against the packed package (test/e2e/packed-package.test.ts).
  { ignores: ['**/node_modules/', 'functions/lib/', 'coverage/', 'bench/results/', 'web/dist/', 'test/e2e/outside-project/'] },
  js.configs.recommended,
  ...tseslint.configs.strictTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: { allowDefaultProject: ['*.js', '*.mjs'] }, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      '@typescript-eslint/restrict-template-expressions': ['error', { allowNumber: true, allowBoolean: true }],
      '@typescript-eslint/no-confusing-void-expression': 'off',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
    },
  },
  {
    files: ['**/*.js', '**/*.mjs'],
    extends: [tseslint.configs.disableTypeChecked],
    languageOptions: { globals: { module: 'writable', require: 'readonly', process: 'readonly', console: 'readonly' } },
  },
  {
    files: ['test/**/*.ts'],
    rules: { '@typescript-eslint/no-non-null-assertion': 'off' },
  },
  ...layering,
  engineThroughStore,
  ...examplesThroughPublicApi,
);
