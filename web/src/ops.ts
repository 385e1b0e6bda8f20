/**
 * The operator console (/ops): the same sign-in as the chat page (anonymous, on the Auth emulator),
 * then a check of the `admin` custom claim on a freshly issued ID token. Without it the page says
 * so, shows the user ID to grant and reads nothing (the security rules and `opsAction` refuse such a
 * user anyway). With it, the console (ops-console.ts) starts.
 */
import './styles.css';
import type { User } from 'firebase/auth';
import { connectAndSignIn } from './connect';
import { byId, el } from './dom';
import { createOpsApi } from './ops-api';
import { OpsConsole } from './ops-console';

/** Whether the user's ID token, issued now (not the cached one), carries `admin: true`. */
async function isOperator(user: User): Promise<boolean> {
  const token = await user.getIdTokenResult(true);
  return token.claims.admin === true;
}

async function main(): Promise<void> {
  const who = byId('who', HTMLSpanElement);
  const gate = byId('gate', HTMLDivElement);
  const root = byId('ops', HTMLElement);

  const { config, db, user } = await connectAndSignIn();
  who.title = user.uid;
  who.dataset.uid = user.uid;

  const check = el('button', { text: 'Check again', testId: 'ops-recheck', attrs: { type: 'button' } });
  const startWhenOperator = async (): Promise<void> => {
    check.disabled = true;
    if (!(await isOperator(user))) {
      who.textContent = `Signed in · ${user.uid.slice(0, 8)}… · not an operator`;
      gate.replaceChildren(
        el('h2', { text: 'Not an operator' }),
        el('p', { testId: 'ops-denied', text: 'This console is for operators: users with the admin custom claim. You are signed in without it, so it shows you nothing and you can do nothing here.' }),
        el('p', {}, 'Your user ID: ', el('code', { testId: 'ops-uid', text: user.uid })),
        el('p', { className: 'muted' }, 'An operator grants the claim with ', el('code', { text: `npx phaseline admin grant ${user.uid}` }), '; then check again.'),
        check,
      );
      check.disabled = false;
      document.body.dataset.ready = 'denied';
      return;
    }
    who.textContent = `Operator · ${user.uid.slice(0, 8)}…`;
    const ops = new OpsConsole(db, createOpsApi(config, () => user.getIdToken()));
    gate.remove();
    root.append(ops.element);
    ops.start();
    document.body.dataset.ready = 'true';
  };
  check.addEventListener('click', () => void startWhenOperator().catch(fail));
  await startWhenOperator();
}

function fail(error: unknown): void {
  const who = document.getElementById('who');
  const message = error instanceof Error ? error.message : String(error);
  if (who) who.textContent = `Not connected: ${message}`;
  document.body.dataset.ready = 'error';
  console.error(error);
}

main().catch(fail);
