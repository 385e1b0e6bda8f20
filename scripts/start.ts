/**
 * `npm start`: the whole local stack in one command, on the ports firebase.json names, with the
 * chat page. Keeps running until Ctrl-C (SIGINT) or SIGTERM, then stops everything it started.
 *
 *   PHASELINE_WEB_PORT       the chat page's port (default 5173)
 *   PHASELINE_VERBOSE=1      show all of firebase-tools' output (function logs included), not
 *                            only its warnings and errors; the full log is in a file either way
 *   PHASELINE_*              every engine and provider variable reaches the functions and the
 *                            sweeper (see the README's configuration section)
 */
import { StackStoppedError, startLocalStack, stopOnSignals } from './lib/local-stack';

const log = (line: string): void => console.log(line);

async function main(): Promise<void> {
  const startMs = Date.now();
  log('Phaseline: starting the local stack (offline provider unless PHASELINE_PROVIDER says otherwise)');
  const stack = startLocalStack({
    page: true,
    echoEmulatorOutput: process.env.PHASELINE_VERBOSE === '1' ? 'all' : 'problems',
    log: (line) => log(`  ${line}`),
  });
  const state = { stopping: false };
  stopOnSignals(() => {
    state.stopping = true;
    return stack.stop();
  }, log, 0);
  const running = await stack.ready;
  const { ports, config } = running;
  const host = ports.host;
  log(`
Ready in ${((Date.now() - startMs) / 1000).toFixed(1)} s.

  Chat page            ${running.pageUrl ?? '(not served)'}
  Operator console     ${running.pageUrl ? `${running.pageUrl}ops (for users with the admin claim: npx phaseline admin grant <uid>)` : '(not served)'}
  submitJob            ${config.functionsBaseUrl}/submitJob
  cancelJob, decideJob ${config.functionsBaseUrl}/cancelJob, ${config.functionsBaseUrl}/decideJob
  opsAction            ${config.functionsBaseUrl}/opsAction
  Firestore emulator   http://${config.firestoreHost}:${config.firestorePort} (rules from firestore.rules)
  Auth emulator        ${config.authEmulatorUrl}
  Cloud Tasks emulator http://${host}:${ports.tasks}
  Emulator hub         http://${host}:${ports.hub}/emulators
  Sweeper              every minute, in this process
  Emulator log         ${running.logFile}

Press Ctrl-C to stop everything.`);
  const reason = await running.died;
  if (state.stopping) return; // the signal handler finishes the stop and exits
  log(`\nThe emulators stopped unexpectedly: ${reason}`);
  await stack.stop();
  process.exit(1);
}

main().catch((error: unknown) => {
  if (error instanceof StackStoppedError) return; // interrupted while starting: the signal handler stops and exits
  console.error(`\nnpm start failed: ${error instanceof Error ? error.message : String(error)}`);
  process.exit(1);
});
