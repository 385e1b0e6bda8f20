/** `npm test`'s runner: jest, every layer, under the emulators. Extra arguments go to jest. */
import { runUnderEmulators } from './lib/stack';

const quote = (arg: string): string => `'${arg.replaceAll("'", `'\\''`)}'`;
const jestArgs = process.argv.slice(2).map(quote).join(' ');

runUnderEmulators(`npx jest ${jestArgs}`.trim()).then(
  (code) => process.exit(code),
  (error: unknown) => {
    console.error(error instanceof Error ? error.message : error);
    process.exit(1);
  },
);
