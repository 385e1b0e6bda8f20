#!/usr/bin/env node
// The `phaseline` command: runs the TypeScript entry point (main.ts) through tsx, so the CLI needs
// no build step. Signals are passed on to the child; this process exits with the child's status.
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const tsxCli = createRequire(import.meta.url).resolve('tsx/cli');
const child = spawn(process.execPath, [tsxCli, join(here, 'main.ts'), ...process.argv.slice(2)], { stdio: 'inherit' });
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(signal, () => child.kill(signal));
child.on('error', (error) => {
  console.error(`phaseline: could not start tsx (${error.message}); run \`npm ci\` in the repository first`);
  process.exit(1);
});
child.on('exit', (code, signal) => {
  process.exit(code ?? 128 + (signal === 'SIGINT' ? 2 : signal === 'SIGHUP' ? 1 : 15));
});
