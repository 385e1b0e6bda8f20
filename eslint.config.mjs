// @ts-check
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

/** Relative imports of these functions/src folders, from any depth below them. */
const folders = (/** @type {string[]} */ names) => `^(\\.\\./)+(${names.join('|')})(/|$)`;

/**
 * Layering of functions/src, checked rather than promised (test/unit/layering.test.ts proves each
 * rule fires). core/ is the pure centre, tested without an emulator: no Firebase package and
 * nothing from the folders above it. pipelines/ are handed their backends by the triggers, never
 * reach for them. config/ is read by pipelines/ and triggers/, so it imports neither. engine/ talks
 * to Firestore only through store/: no `.db`, no value imported from firebase-admin/firestore.
 */
const layering = [
  {
    files: ['functions/src/core/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              regex: '^(firebase-admin|firebase-functions|firebase|@firebase/[^/]+|@google-cloud/[^/]+)(/|$)',
              message: 'core/ imports no Firebase or Google Cloud package: it is tested without an emulator.',
            },
            {
              regex: folders(['engine', 'store', 'triggers', 'http', 'pipelines', 'providers', 'agent', 'effects', 'config', 'telemetry']),
              message: 'core/ imports nothing above it: move what it needs down into core/.',
            },
          ],
        },
      ],
    },
  },
  {
    files: ['functions/src/telemetry/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            { regex: '^(firebase-admin|firebase-functions|firebase|@firebase/[^/]+|@google-cloud/[^/]+)(/|$)', message: 'telemetry/ imports no Firebase package: the store and triggers call it.' },
            { regex: folders(['engine', 'store', 'triggers', 'http', 'pipelines']), message: 'telemetry/ sits below the code it observes: it is called, it does not call.' },
          ],
        },
      ],
    },
  },
  {
    files: ['functions/src/pipelines/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        { patterns: [{ regex: folders(['triggers']), message: 'pipelines/ do not import triggers/: take backends as parameters.' }] },
      ],
    },
  },
  {
    // The engine talks to Firestore only through the store (store/*.ts): no Firestore instance, no
    // Firestore values (FieldValue, Timestamp, FieldPath, getFirestore); types for signatures only.
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
  },
  {
    files: ['functions/src/config/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        { patterns: [{ regex: folders(['triggers', 'pipelines', 'engine', 'http', 'store']), message: 'config/ sits below the code that reads it.' }] },
      ],
    },
  },
];

export default tseslint.config(
  { ignores: ['**/node_modules/', 'functions/lib/', 'coverage/', 'bench/results/', 'web/dist/'] },
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
);
