/**
 * The soak's reader and checker against the sweeper's retention pass: stamping an ended job's
 * transcripts and events (`expireAt`, 15 minutes after it ended) moves their update times, which
 * the soak used to read as commit times. The job below is clean; after the stamps, the checker must
 * still find nothing.
 */
import type { Firestore } from 'firebase-admin/firestore';
import { RETENTION_GRACE_MS } from '../../functions/src/engine/retention';
import { sweep } from '../../functions/src/engine/sweeper';
import { EXPIRE_AT } from '../../functions/src/store/retention';
import { collectJobs } from '../../scripts/chaos/collect';
import { checkInvariants } from '../../scripts/chaos/invariants';
import { engineSuite } from '../support/engine';
import { researchSetup } from '../support/research';

const harness = engineSuite('chaos-collect-retention', (firestore, clock) => researchSetup(firestore.db, clock).registry);

const db = (): Firestore => harness.firestore.db;

test("a finished research job whose transcripts and events the retention pass stamped breaks no invariant of the soak's checker", async () => {
  const jobId = await harness.submit('research', { question: 'How do leases fence stale workers?', experts: 2, sections: 2, wordsPerSection: 60 });
  expect((await harness.drain()).at(-1)?.kind).toBe('completed');
  harness.clock.advance(RETENTION_GRACE_MS + 1_000);
  await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());

  // The stamps landed after the job's last write: the update times of its transcripts moved past its end.
  const transcripts = await db().collection(`jobs/${jobId}/transcripts`).get();
  expect(transcripts.size).toBeGreaterThan(0);
  expect(transcripts.docs.every((doc) => doc.get(EXPIRE_AT) !== undefined)).toBe(true);
  expect(transcripts.docs.some((doc) => doc.updateTime.valueOf() > doc.createTime.valueOf())).toBe(true);

  const jobs = await collectJobs(db());
  const report = checkInvariants({ jobs, submissions: [], receiver: { applications: [], requests: [] }, toolResultsSeen: [], toolExecutions: [] });
  // The job was submitted here, not through the soak's client, so the check that ties jobs to accepted submissions is left out.
  const broken = report.invariants.filter((invariant) => invariant.name !== 'duplicateJobs' && invariant.violations.length > 0).map((invariant) => `${invariant.name}: ${invariant.violations[0]?.detail ?? ''}`);
  expect(broken).toEqual([]);
});

test("the reader records each document's stamp and each unit's cost: a stamp left on a job that runs again, and a unit cost the job never counted, are flagged", async () => {
  const jobId = await harness.submit('research', { question: 'How do leases fence stale workers?', experts: 2, sections: 2, wordsPerSection: 60 });
  expect((await harness.drain()).at(-1)?.kind).toBe('completed');
  harness.clock.advance(RETENTION_GRACE_MS + 1_000);
  await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
  const units = await db().collection(`jobs/${jobId}/units`).get();
  expect(units.size).toBe(2);
  const [first] = await collectJobs(db());
  expect(first?.unitCosts.map((unit) => unit.cost)).toEqual(units.docs.map((doc) => doc.get('cost') as unknown));
  expect(first?.unitCosts.every((unit) => (unit.cost.modelCalls ?? 0) > 0)).toBe(true);

  // As if a re-drive's taking off of the stamps had failed: the job is queued again with its timeline stamped;
  // and one unit's cost, as if its fan-out had ended without counting it.
  await db().doc(`jobs/${jobId}`).update({ status: 'queued' });
  await units.docs[0]?.ref.update({ costInJob: {} });

  const jobs = await collectJobs(db());
  const report = checkInvariants({ jobs, submissions: [], receiver: { applications: [], requests: [] }, toolResultsSeen: [], toolExecutions: [] });
  const violations = (name: string) => report.invariants.find((invariant) => invariant.name === name)?.violations.map((violation) => violation.detail) ?? [];
  expect(violations('expiryOnLiveJob')).toEqual([expect.stringMatching(/^queued job: \d+ document\(s\) carry expireAt \((events|transcripts|drafts)\//)]);
  expect(violations('costNotSummed')).toContainEqual(expect.stringMatching(new RegExp(`^unit ${units.docs[0]?.id ?? ''} \\(done, fan-out epoch \\d+\\): modelCalls \\d+ spent, only 0 reached the job's cost$`)));
});

