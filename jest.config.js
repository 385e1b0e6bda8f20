// @ts-check
/** Three layers, each runnable alone with `--selectProjects`: unit, emulator, e2e. */
const transform = {
  '^.+\\.(t|j)sx?$': ['@swc/jest', { jsc: { parser: { syntax: 'typescript' }, target: 'es2023' }, module: { type: 'commonjs' } }],
};
// Packages that ship ESM only; jest's module system needs them as CommonJS: p-retry and its
// dependency; request-filtering-agent; linkedom's DOM helpers (css-select and the htmlparser2 family).
const esmOnly = ['p-retry', 'is-network-error', 'request-filtering-agent', 'css-select', 'css-what', 'domutils', 'domhandler', 'domelementtype', 'dom-serializer', 'entities', 'nth-check', 'boolbase', 'cssomnom'];
const transformIgnorePatterns = [`/node_modules/(?!(${esmOnly.join('|')})/)`];
// `phaseline` is the public API as examples/ import it (tsconfig.json `paths`): the source, not the built package.
const moduleNameMapper = { '^phaseline$': '<rootDir>/functions/src/api/index.ts' };
const shared = { transform, transformIgnorePatterns, moduleNameMapper, testEnvironment: 'node' };

/** @type {import('jest').Config} */
module.exports = {
  // The emulator layers make real round trips; contended transactions back off for seconds.
  testTimeout: 60_000,
  projects: [
    { ...shared, displayName: 'unit', testMatch: ['<rootDir>/test/unit/**/*.test.ts'] },
    {
      ...shared,
      displayName: 'emulator',
      testMatch: ['<rootDir>/test/emulator/**/*.test.ts'],
      globalSetup: '<rootDir>/test/support/firestore-global-setup.ts',
      globalTeardown: '<rootDir>/test/support/firestore-global-teardown.ts',
    },
    {
      ...shared,
      displayName: 'e2e',
      testMatch: ['<rootDir>/test/e2e/**/*.test.ts'],
      globalSetup: '<rootDir>/test/support/e2e-global-setup.ts',
    },
  ],
};
