/**
 * firestore.rules for the operator console, on the official emulator: a user with the `admin`
 * custom claim reads any user's job, lists and counts jobs by status (the console's queries), and
 * reads the timeline, units and effect ledger of any job, but not its transcripts, drafts,
 * sections, results or artifacts; a user without the claim (or with a claim that is not `true`)
 * reads none of it; nobody writes, operators included. The users' content an operator does read
 * (rules grant whole documents) is exactly what firestore.rules and docs/security.md say. The last block
 * loads loosened copies of the rules and shows that these checks catch each loosening.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { assertFails, assertSucceeds, type RulesTestEnvironment, type TokenOptions } from '@firebase/rules-unit-testing';
import {
  collection,
  deleteDoc,
  doc,
  getCountFromServer,
  getDoc,
  getDocs,
  limit,
  orderBy,
  query,
  setDoc,
  updateDoc,
  where,
  type Firestore,
} from 'firebase/firestore';

import { sendIntent } from '../../functions/src/pipelines/notify/plan';
import { as, RULES, rulesSuite, type Loosening } from '../support/rules';

const OWNER = 'alice';
const OPERATOR = 'olga';
const STRANGER = 'bob';
/** What the console reads under a job. */
const CONSOLE_SUBCOLLECTIONS = ['events', 'units', 'effects'] as const;
/** Subcollections operators do not read (more of the user's content; what they do read of it is listed in firestore.rules). */
const PRIVATE_SUBCOLLECTIONS = ['transcripts', 'drafts', 'sections', 'results', 'checkpoints', 'claims', 'artifacts', 'artifactChunks'] as const;

/** alice's quarantined job with every subcollection, written with the rules off. */
async function seed(env: RulesTestEnvironment): Promise<void> {
  await env.clearFirestore();
  await env.withSecurityRulesDisabled(async (context) => {
    const db = context.firestore() as unknown as Firestore;
    await setDoc(doc(db, 'jobs/job-a'), { owner: OWNER, pipeline: 'research', status: 'quarantined', updatedAt: 1, createdAt: 1, finishedAt: null });
    await setDoc(doc(db, 'jobs/job-b'), { owner: STRANGER, pipeline: 'canary', status: 'failed', updatedAt: 2, createdAt: 2, finishedAt: 2 });
    for (const subcollection of [...CONSOLE_SUBCOLLECTIONS, ...PRIVATE_SUBCOLLECTIONS]) {
      await setDoc(doc(db, `jobs/job-a/${subcollection}/d1`), { note: `${subcollection} of job-a`, atMs: 1 });
    }
  });
}

const operator = (env: RulesTestEnvironment): Firestore => as(env, OPERATOR, { admin: true });

/** The console's queries: a list by status, newest first; a count by pipeline and status. */
const quarantinedList = (db: Firestore) => getDocs(query(collection(db, 'jobs'), where('status', '==', 'quarantined'), orderBy('updatedAt', 'desc'), limit(50)));
const researchQuarantinedCount = (db: Firestore) => getCountFromServer(query(collection(db, 'jobs'), where('pipeline', '==', 'research'), where('status', '==', 'quarantined')));

/** The probes the loosened-rules block reuses. */
const strangerReadsJob = (env: RulesTestEnvironment) => getDoc(doc(as(env, STRANGER), 'jobs/job-a'));
const strangerListsQuarantined = (env: RulesTestEnvironment) => quarantinedList(as(env, STRANGER));
const operatorReadsTranscript = (env: RulesTestEnvironment) => getDoc(doc(operator(env), 'jobs/job-a/transcripts/d1'));
const operatorReadsArtifact = (env: RulesTestEnvironment) => getDoc(doc(operator(env), 'jobs/job-a/artifacts/d1'));
const operatorUpdatesJob = (env: RulesTestEnvironment) => updateDoc(doc(operator(env), 'jobs/job-a'), { status: 'queued' });

let env: RulesTestEnvironment;
const { catchesLoosening } = rulesSuite('ops-rules', seed, (created) => {
  env = created;
});

describe('an operator (admin claim) reads', () => {
  test("another user's job", async () => {
    const snapshot = await assertSucceeds(getDoc(doc(operator(env), 'jobs/job-a')));
    expect(snapshot.get('owner')).toBe(OWNER);
  });

  test('jobs listed by status, newest first (the console lists)', async () => {
    const listed = await assertSucceeds(quarantinedList(operator(env)));
    expect(listed.docs.map((snapshot) => snapshot.id)).toEqual(['job-a']);
  });

  test('jobs counted by pipeline and status (the console counts)', async () => {
    const counted = await assertSucceeds(researchQuarantinedCount(operator(env)));
    expect(counted.data().count).toBe(1);
  });

  test('every job, without a filter', async () => {
    const listed = await assertSucceeds(getDocs(collection(operator(env), 'jobs')));
    expect(listed.size).toBe(2);
  });

  test.each(CONSOLE_SUBCOLLECTIONS)("another user's job's %s, a document and the list", async (subcollection) => {
    await assertSucceeds(getDoc(doc(operator(env), `jobs/job-a/${subcollection}/d1`)));
    const listed = await assertSucceeds(getDocs(collection(operator(env), `jobs/job-a/${subcollection}`)));
    expect(listed.size).toBe(1);
  });
});

describe('an operator does not read', () => {
  test.each(PRIVATE_SUBCOLLECTIONS)("a job's %s (the user's content), a document or the list", async (subcollection) => {
    await assertFails(getDoc(doc(operator(env), `jobs/job-a/${subcollection}/d1`)));
    await assertFails(getDocs(collection(operator(env), `jobs/job-a/${subcollection}`)));
  });

  test('the engine\'s own collections (circuits, rejected tasks) or a user\'s conversation', async () => {
    await assertFails(getDoc(doc(operator(env), 'circuits/offline')));
    await assertFails(getDocs(collection(operator(env), 'rejectedTasks')));
    await assertFails(getDoc(doc(operator(env), 'conversations/conv-a')));
  });
});

describe('what an operator sees of the user\'s content', () => {
  /** Text only the owner wrote (or the work done for them): wherever an operator's read finds it, they see the user's content. */
  const MARK = 'alice-private-7f3c';
  const README = readFileSync(join(__dirname, '..', '..', 'docs', 'security.md'), 'utf8');
  /** The backticked field paths (`jobs/{id}.input`, `jobs/{id}/effects.intent`) a text names as what operators see. */
  const declared = (text: string): string[] => [...new Set([...text.matchAll(/`(jobs\/\{id\}(?:\/[a-zA-Z]+)?\.[a-zA-Z]+)`/g)].map(([, path = '']) => path))].sort();

  /** A notify job of alice's, cancelled after a decision, as the engine stores one (its content marked), with a unit, an event and an effect. */
  async function seedContent(): Promise<void> {
    await env.withSecurityRulesDisabled(async (context) => {
      const db = context.firestore() as unknown as Firestore;
      const recipient = { id: 'c001', name: `Ann ${MARK}`, address: `${MARK}@example.test` };
      await setDoc(doc(db, 'jobs/job-c'), {
        owner: OWNER,
        pipeline: 'notify',
        status: 'cancelled',
        conversationId: 'conv-c',
        input: { campaign: `Renewals ${MARK}`, recipients: [recipient], subject: `Subject ${MARK}`, template: `Dear {name}, ${MARK}` },
        decisions: { 'unknown-effects-1': `retry ${MARK}` },
        cancellation: { at: 1, reason: `changed my mind ${MARK}`, by: null, phase: 'send', sectionsDone: 0, effects: null },
        lastError: null,
        updatedAt: 3,
        createdAt: 1,
        finishedAt: 3,
      });
      await setDoc(doc(db, 'jobs/job-c/events/e1'), { kind: 'decided', message: `Outcomes unknown → retry ${MARK}`, atMs: 2 });
      await setDoc(doc(db, 'jobs/job-c/units/expert-1'), { status: 'done', epoch: 1, progress: {}, result: { sections: [`finding ${MARK}`] } });
      await setDoc(doc(db, 'jobs/job-c/effects/k1'), { state: 'applied', intent: sendIntent(`Renewals ${MARK}`, { recipient, subject: `Subject ${MARK}`, body: `Dear Ann, ${MARK}` }), intentHash: 'h' });
      await setDoc(doc(db, 'jobs/job-c/sections/s1'), { data: { text: `section ${MARK}` } });
      await setDoc(doc(db, 'jobs/job-c/results/final'), { markdown: `answer ${MARK}` });
      await setDoc(doc(db, 'conversations/conv-c'), { owner: OWNER });
      await setDoc(doc(db, 'conversations/conv-c/messages/job-c'), { markdown: `answer ${MARK}` });
    });
  }

  test("bug 36: every field through which an operator reads the user's content is named in firestore.rules and in docs/security.md, and nothing else of it is readable", async () => {
    await seedContent();
    const seen = new Set<string>();
    const look = (prefix: string, data: Readonly<Record<string, unknown>> | undefined) => {
      for (const [field, value] of Object.entries(data ?? {})) if (JSON.stringify(value).includes(MARK)) seen.add(`${prefix}.${field}`);
    };
    look('jobs/{id}', (await assertSucceeds(getDoc(doc(operator(env), 'jobs/job-c')))).data());
    for (const subcollection of CONSOLE_SUBCOLLECTIONS) {
      for (const snapshot of (await assertSucceeds(getDocs(collection(operator(env), `jobs/job-c/${subcollection}`)))).docs) look(`jobs/{id}/${subcollection}`, snapshot.data());
    }
    const readable = [...seen].sort();
    expect(readable).toEqual(['jobs/{id}.cancellation', 'jobs/{id}.decisions', 'jobs/{id}.input', 'jobs/{id}/effects.intent', 'jobs/{id}/events.message', 'jobs/{id}/units.result']);
    expect(declared(RULES)).toEqual(readable);
    const securityRules = /^## Security rules\n([\s\S]*?)(?=^## )/m.exec(README)?.[1] ?? '';
    expect(declared(securityRules)).toEqual(readable);
    // Where the rest of it lives, operators are refused.
    for (const path of ['jobs/job-c/sections/s1', 'jobs/job-c/results/final', 'conversations/conv-c', 'conversations/conv-c/messages/job-c']) {
      await assertFails(getDoc(doc(operator(env), path)));
    }
  });
});

describe('a user without the claim reads nothing of another user\'s', () => {
  const withoutTheClaim: readonly [string, TokenOptions][] = [
    ['no claim', {}],
    ['admin: false', { admin: false }],
    ['admin: "true" (a string)', { admin: 'true' }],
    ['admin: 1', { admin: 1 }],
  ];

  test.each(withoutTheClaim)('%s: the job, the console lists and counts, the timeline', async (_label, claims) => {
    const db = as(env, STRANGER, claims);
    await assertFails(getDoc(doc(db, 'jobs/job-a')));
    await assertFails(quarantinedList(db));
    await assertFails(researchQuarantinedCount(db));
    await assertFails(getDocs(collection(db, 'jobs')));
    for (const subcollection of CONSOLE_SUBCOLLECTIONS) {
      await assertFails(getDoc(doc(db, `jobs/job-a/${subcollection}/d1`)));
      await assertFails(getDocs(collection(db, `jobs/job-a/${subcollection}`)));
    }
  });

  test('signed out: the console lists and counts', async () => {
    await assertFails(quarantinedList(as(env, null)));
    await assertFails(researchQuarantinedCount(as(env, null)));
  });
});

describe('nobody writes, operators included', () => {
  test('an operator cannot create, update or delete a job', async () => {
    await assertFails(setDoc(doc(operator(env), 'jobs/job-new'), { owner: OPERATOR, pipeline: 'research', status: 'queued' }));
    await assertFails(operatorUpdatesJob(env));
    await assertFails(deleteDoc(doc(operator(env), 'jobs/job-a')));
  });

  test.each([...CONSOLE_SUBCOLLECTIONS, ...PRIVATE_SUBCOLLECTIONS])("an operator cannot write a job's %s", async (subcollection) => {
    await assertFails(setDoc(doc(operator(env), `jobs/job-a/${subcollection}/new`), { note: 'forged' }));
    await assertFails(updateDoc(doc(operator(env), `jobs/job-a/${subcollection}/d1`), { note: 'forged' }));
    await assertFails(deleteDoc(doc(operator(env), `jobs/job-a/${subcollection}/d1`)));
  });

  test('an operator cannot write limits or quota usage', async () => {
    await assertFails(setDoc(doc(operator(env), `userLimits/${OWNER}`), { jobsInFlight: 100 }));
    await assertFails(setDoc(doc(operator(env), `quotaUsage/${OWNER}`), { inFlightJobIds: [] }));
  });
});

/**
 * Each loosening is applied to a copy of the real rules (the replaced text must be in them), loaded
 * into an environment of its own; the probe is a call an assertion above makes, and it now succeeds,
 * so that assertion would fail against the loosened rules.
 */
describe('a loosened operator rule makes the checks above fail', () => {
  const loosenings: readonly Loosening[] = [
    {
      label: 'ops-loose-claim',
      what: 'the claim check removed (any signed-in user is an operator): a stranger reads the job',
      from: 'request.auth != null && request.auth.token.admin == true;',
      to: 'request.auth != null;',
      probe: strangerReadsJob,
    },
    {
      label: 'ops-loose-truthy',
      what: 'any admin claim counts (not only true): a stranger lists quarantined jobs',
      from: 'request.auth.token.admin == true',
      to: "request.auth.token.keys().hasAny(['admin']) || request.auth != null",
      probe: strangerListsQuarantined,
    },
    {
      label: 'ops-loose-transcripts',
      what: 'the subcollection list widened to transcripts: an operator reads one',
      from: "subcollection in ['events', 'units', 'effects']",
      to: "subcollection in ['events', 'units', 'effects', 'transcripts']",
      probe: operatorReadsTranscript,
    },
    {
      label: 'ops-loose-artifacts',
      what: 'the subcollection check dropped for operators: an operator reads an artifact',
      from: "allow read: if isOperator() && subcollection in ['events', 'units', 'effects'];",
      to: 'allow read: if isOperator();',
      probe: operatorReadsArtifact,
    },
    {
      label: 'ops-loose-write',
      what: 'operators allowed to write jobs: an operator requeues one from the browser',
      from: 'allow read: if isOperator();',
      to: 'allow read, write: if isOperator();',
      probe: operatorUpdatesJob,
    },
  ];

  test.each(loosenings)('$what', (loosening) => catchesLoosening(loosening));
});
