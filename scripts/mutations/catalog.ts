/**
 * The protections `npm run test:mutations` removes, one at a time, and the deterministic tests
 * that must notice. Each mutant is an exact search/replace on one source file; a search text that
 * is not found exactly once stops the check, so this list cannot drift silently when the code it
 * names changes: update the search text (and the tests) instead.
 */

export interface TestSelection {
  /** Test files, relative to the repository root (under test/unit or test/emulator). */
  readonly files: readonly string[];
  /** A regular expression over full test names, as jest's --testNamePattern takes it. */
  readonly names: string;
}

export interface Mutant {
  /** Short kebab-case name, shown in the table and accepted by --only. */
  readonly name: string;
  /** The protection that is removed, in words. */
  readonly removes: string;
  readonly file: string;
  readonly search: string;
  readonly replace: string;
  /** At least one of these tests must fail with the mutant applied. */
  readonly tests: readonly TestSelection[];
}

const FENCING = 'test/emulator/fencing.test.ts';
const HOLES = 'test/emulator/engine-holes.test.ts';
const RUNNER = 'test/emulator/runner.test.ts';

export const MUTANTS: readonly Mutant[] = [
  {
    name: 'job-epoch-check',
    removes: 'the fencing epoch in holdsClaim (status alone decides who owns a job)',
    file: 'functions/src/store/job-store.ts',
    search: "return job.status === 'running' && job.epoch === claim.epoch && job.lease?.epoch === claim.epoch;",
    replace: "return job.status === 'running';",
    tests: [{ files: [FENCING], names: 'bug 14: job, ' }],
  },
  {
    name: 'unit-epoch-check',
    removes: 'the fencing epoch in holdsUnitClaim (status alone decides who owns a unit)',
    file: 'functions/src/store/job-store.ts',
    search: "    unit.status === 'running' &&\n    unit.epoch === claim.epoch &&\n    unit.lease?.epoch === claim.epoch\n",
    replace: "    unit.status === 'running'\n",
    tests: [{ files: [FENCING], names: 'bug 14: unit, ' }],
  },
  {
    name: 'fanout-epoch-check',
    removes: "the job's fan-out epoch in holdsUnitClaim (a unit of a fan-out that ended may write)",
    file: 'functions/src/store/job-store.ts',
    search: '    job.fanout?.epoch === claim.fanoutEpoch &&\n',
    replace: '',
    tests: [{ files: [FENCING], names: 'bug 14: unit, fan-out epoch: a unit of a fan-out that ended writes (its completing commit|an effect plan)' }],
  },
  {
    name: 'claim-running-job',
    removes: 'the claim decision refusing a job that is not queued at this task\'s step (a stale task claims a running job)',
    file: 'functions/src/core/lifecycle.ts',
    search: "  if (job.status !== 'queued') return { claimable: false, reason: `job is ${job.status}` };\n  if (job.step !== step) return { claimable: false, reason: `task is for step ${step}, job is at step ${job.step}` };\n",
    replace: "  if (job.status === 'completed') return { claimable: false, reason: `job is ${job.status}` };\n",
    tests: [{ files: [FENCING], names: 'bug 14: job, claim:' }],
  },
  {
    name: 'claim-running-unit',
    removes: 'the unit claim refusing a unit that is not queued at this task\'s step (a stale task claims a running unit)',
    file: 'functions/src/core/transitions.ts',
    search: "  if (unit.status !== 'queued') throw new TransitionRefused(`unit is ${unit.status}`);\n  if (unit.step !== input.step) throw new TransitionRefused(`task is for unit step ${input.step}, unit is at step ${unit.step}`);\n",
    replace: "  if (unit.status === 'done') throw new TransitionRefused(`unit is ${unit.status}`);\n",
    tests: [{ files: [FENCING], names: 'bug 14: unit, claim:' }],
  },
  {
    name: 'job-update-time',
    removes: 'the lastUpdateTime precondition on every job commit',
    file: 'functions/src/store/job-store.ts',
    search: 'tx.update(snapshot.ref, encodeJob(record), { lastUpdateTime: snapshot.updateTime });',
    replace: 'tx.update(snapshot.ref, encodeJob(record));',
    // Job transitions are conditioned commits, not transactions: the precondition alone keeps a second claimer (or a duplicate delivery) out.
    tests: [
      { files: [FENCING], names: 'bug 14: update time: a job commit' },
      { files: [RUNNER], names: 'fault 6: the same task delivered twice' },
    ],
  },
  {
    name: 'unit-update-time',
    removes: 'the lastUpdateTime precondition on every unit commit',
    file: 'functions/src/store/job-store.ts',
    search: 'tx.update(snapshot.ref, encodeUnit({ ...next, updatedAtMs: this.clock.now() }), { lastUpdateTime: snapshot.updateTime });',
    replace: 'tx.update(snapshot.ref, encodeUnit({ ...next, updatedAtMs: this.clock.now() }));',
    tests: [{ files: [FENCING], names: 'bug 14: update time: a unit commit' }],
  },
  {
    name: 'outbox-in-completion',
    removes: 'the outbox (published answer) write in the completing commit',
    file: 'functions/src/engine/step/publication.ts',
    search: '      if (!published.exists) {\n        tx.create(outbox, {',
    replace: '      if (!published.exists) {\n        void ({',
    tests: [
      { files: [FENCING], names: 'bug 14: job, completion and publication' },
      { files: ['test/emulator/runner.test.ts'], names: 'publishes one result|published as the assistant message' },
    ],
  },
  {
    name: 'completion-over-unknown-effect',
    removes: 'the completing commit refusing while an effect is unresolved',
    file: 'functions/src/engine/step/publication.ts',
    search: 'if (unresolved.length > 0) throw new UnresolvedEffectsError(unresolved);',
    replace: '',
    tests: [{ files: ['test/emulator/effects.test.ts'], names: 'a job cannot complete while an effect is unknown' }],
  },
  {
    name: 'lookup-before-effect-retry',
    removes: 'the lookup in the system of record before an unknown effect is retried',
    file: 'functions/src/effects/protocol.ts',
    search: 'const lookup = await adapter.lookup(entry.idempotencyKey, options.signal);',
    replace: "const lookup = { kind: 'not-found' } as const;",
    tests: [{ files: ['test/emulator/effects.test.ts'], names: 'reconciled as applied from a lookup|fault 9:' }],
  },
  {
    name: 'tool-result-saved',
    removes: 'saving each tool result before the next call',
    file: 'functions/src/agent/section-runner.ts',
    search: "content, sources },\n      );\n      await this.save();\n",
    replace: "content, sources },\n      );\n",
    tests: [
      { files: ['test/unit/agent-section-runner.test.ts'], names: 'every step saved|bug 3: a worker killed after each tool result' },
      { files: ['test/emulator/research.test.ts'], names: 'fault 1:' },
      { files: ['test/emulator/research-web.test.ts'], names: 'a worker that dies after a page was fetched' },
    ],
  },
  {
    name: 'sweeper-lease-recheck',
    removes: "the sweeper's re-check, inside its transaction, that the lease is still expired",
    file: 'functions/src/core/transitions.ts',
    search: "  if (held.expiresAtMs > nowMs) throw new TransitionRefused('the lease was extended since the query');\n  const decision = decideExpiredLease(job, options);\n",
    replace: '  const decision = decideExpiredLease(job, options);\n',
    tests: [{ files: ['test/emulator/sweeper.test.ts'], names: 'fault 7:' }],
  },
  {
    name: 'fanout-joins-at-start',
    removes: 'the join inside the commit that starts a fan-out with no unit work (the job is left running, unleased, unit-less)',
    file: 'functions/src/engine/step/fan-out.ts',
    search: '      if (toEnqueue.length === 0) {\n',
    replace: '      if (false as boolean) {\n',
    tests: [{ files: [HOLES], names: 'bug 1: a fan-out of zero units' }],
  },
  {
    name: 'units-keyed-by-phase',
    removes: 'the phase in a unit document key (two fan-out phases share unit documents)',
    file: 'functions/src/store/paths.ts',
    search: '`${JOBS}/${jobId}/units/${phase}~${unit}`',
    replace: '`${JOBS}/${jobId}/units/${unit}`',
    tests: [{ files: [HOLES], names: 'bug 5: two fan-out phases' }],
  },
  {
    name: 'unit-cost-counted-once',
    removes: "the part of a unit's cost already counted in the job (a re-run unit adds its old cost again)",
    file: 'functions/src/engine/step/running.ts',
    search: '    const counted = unit.costInJob[key] ?? 0;\n',
    replace: '    const counted = 0;\n',
    tests: [{ files: [HOLES], names: 'bug 5: a finished unit whose result stops validating' }],
  },
  {
    name: 'poison-resets-on-checkpoint',
    removes: 'the lost-worker count starting again when a phase checkpoints',
    file: 'functions/src/core/transitions.ts',
    search: '    staleReclaims: input.checkpointed ? 0 : job.staleReclaims,\n',
    replace: '    staleReclaims: job.staleReclaims,\n',
    tests: [{ files: [HOLES], names: 'bug 8: five workers lost over five phases' }],
  },
  {
    name: 'poison-resets-on-section',
    removes: 'the lost-worker count starting again when a section is recorded',
    file: 'functions/src/engine/step/durable-writes.ts',
    search: '        if (!created || job.staleReclaims === 0) return { value: created };\n',
    replace: '        return { value: created };\n',
    tests: [{ files: [HOLES], names: 'bug 8: five workers lost, each right after recording' }],
  },
  {
    name: 'server-delay-cap',
    removes: 'the cap on a server-given delay in the error decision',
    file: 'functions/src/core/lifecycle.ts',
    search: 'capServerDelay(error.retryAfterMs, options.maxServerDelaySeconds * 1000)',
    replace: 'capServerDelay(error.retryAfterMs, Number.POSITIVE_INFINITY)',
    tests: [{ files: [HOLES], names: 'bug 4: Retry-After of' }],
  },
  {
    name: 'provider-wait-needs-resume-time',
    removes: 'the refusal of a provider wait without a resume time',
    file: 'functions/src/core/lifecycle.ts',
    search: "  if (typeof untilMs !== 'number' || !Number.isFinite(untilMs)) {\n",
    replace: '  if (false as boolean) {\n',
    tests: [{ files: [HOLES], names: 'bug 9: a provider wait without' }],
  },
  {
    name: 'unit-event-ids-unique',
    removes: 'the per-commit part of unit event IDs (two commits in one millisecond name their events alike)',
    file: 'functions/src/store/job-store.ts',
    search: "-${commit}-${index}`;\n",
    replace: "-${index}`;\n      void commit;\n",
    tests: [{ files: [HOLES], names: 'bug 10:' }],
  },
  {
    name: 'cost-applied-once-per-claim',
    removes: "the claim's tally of cost and notes already written (a re-run write adds them again)",
    file: 'functions/src/core/flusher.ts',
    search: '  const previous = record.claimTally?.epoch === epoch ? record.claimTally : { epoch, cost: {}, notes: 0 };\n',
    replace: '  const previous = { epoch, cost: {} as Readonly<Record<string, number>>, notes: 0 };\n',
    tests: [{ files: [HOLES], names: 'bug 12:' }],
  },
  {
    name: 'takeover-needs-stale-heartbeat',
    removes: 'the stale-heartbeat condition on a takeover (a redelivered task takes a live worker\'s job)',
    file: 'functions/src/core/lifecycle.ts',
    search: '  if (ageMs < staleMs && lease.expiresAtMs > nowMs) {\n',
    replace: '  if (false as boolean) {\n',
    tests: [{ files: ['test/emulator/recovery.test.ts'], names: 'keeps heartbeating|a redelivery while the heartbeat is fresh' }],
  },
  {
    name: 'lease-renewal-needs-progress',
    removes: 'the progress bound on lease renewal (a wedged step holds its job for ever)',
    file: 'functions/src/engine/step/running.ts',
    search: '    if (idleMs > store.options.progressTimeoutSeconds * 1000) {\n',
    replace: '    if (false as boolean) {\n',
    tests: [{ files: ['test/emulator/recovery.test.ts'], names: 'wedged on a tool' }],
  },
  {
    name: 'tool-rounds-from-transcript',
    removes: 'counting the tool rounds already in the transcript (a slow section yields for ever)',
    file: 'functions/src/agent/section-runner.ts',
    search: '    let rounds = toolRoundsSincePrompt(this.messages, this.spec.promptId);\n',
    replace: '    let rounds = 0;\n',
    tests: [{ files: ['test/unit/agent-section-runner.test.ts'], names: 'bug 11: a slow model that never stops' }],
  },
  {
    name: 'owner-write-precondition',
    removes: "the update-time precondition on a claim holder's conditioned commit (a holder that has written before writes on after losing its claim)",
    file: 'functions/src/store/claim-session.ts',
    search: '    batch.update(this.slot, { lastWriteAtMs: this.store.clock.now() }, { lastUpdateTime: updateTime });\n',
    replace: '    batch.set(this.slot, { lastWriteAtMs: this.store.clock.now(), lastUpdate: updateTime }, { merge: true });\n',
    tests: [{ files: [FENCING], names: 'bug 14: (job|unit), (section after an earlier one|transcript after an earlier save)|a reclaimed owner writes' }],
  },
  {
    name: 'owner-slot-epoch-check',
    removes: "the epoch check when a claim holder reads its slot (any held slot passes, whoever holds it)",
    file: 'functions/src/store/claim-session.ts',
    search: "state !== 'held' || epoch !== this.epoch || ",
    replace: "state !== 'held' || ",
    tests: [{ files: [FENCING], names: 'bug 14: (job|unit), (section|transcript):' }],
  },
  {
    name: 'slot-revoked-on-release',
    removes: "revoking the claim slot when a claim ends without a new holder (a reclaimed worker writes on until someone claims again)",
    file: 'functions/src/store/job-store.ts',
    search: '    if (before === after) return;\n',
    replace: '    if (before === after || after === null) return;\n',
    tests: [{ files: [FENCING], names: 'a reclaimed owner writes' }],
  },
  {
    name: 'ended-fanout-revokes-units',
    removes: "revoking, in the commit that ends a fan-out, the claims of its units (a unit of an ended fan-out records sections)",
    file: 'functions/src/store/job-store.ts',
    search: '      tx.set(this.claimSlotRef(jobId, unitClaimSlot(fanout.phase, unit)), revoked);\n',
    replace: '      void revoked;\n',
    tests: [
      { files: [FENCING], names: 'bug 14: unit, fan-out epoch:' },
      { files: ['test/emulator/ended-fanout.test.ts'], names: 'bug 15: (a sibling|an owner cancels)' },
    ],
  },
  {
    name: 'fanout-ends-when-job-stops',
    removes: "treating a job that stops running (quarantine keeps its fan-out record) as ending its fan-out",
    file: 'functions/src/store/job-store.ts',
    search: " || next.status !== 'running')) this.endFanOut(",
    replace: ')) this.endFanOut(',
    tests: [{ files: ['test/emulator/ended-fanout.test.ts'], names: 'bug 15: a sibling unit quarantines' }],
  },
  {
    name: 'failed-heartbeat-retried-soon',
    removes: 'trying a failed heartbeat again within a second (the lease stays silent a whole interval more, and a duplicate task takes a live worker\'s unit)',
    file: 'functions/src/core/flusher.ts',
    search: '    const dueInMs = this.lastWriteFailed\n',
    replace: '    const dueInMs = (false as boolean)\n',
    tests: [{ files: ['test/emulator/unit-heartbeat.test.ts'], names: 'bug 16: one failed heartbeat of a live worker, then a duplicate task: the worker keeps its unit; with the defaults' }],
  },
  {
    name: 'heartbeat-events-named-once',
    removes: 'naming a heartbeat\'s timeline events once per flush (a commit repeated after a lost answer writes its notes twice)',
    file: 'functions/src/engine/step/unit-step.ts',
    search: '      for (const { ref, data } of events) batch.set(ref, data);\n',
    replace: '      for (const { ref, data } of store.unitEventDocuments(job, next, applied.notes)) batch.set(ref, data);\n',
    tests: [{ files: ['test/emulator/unit-heartbeat.test.ts'], names: 'bug 16: a heartbeat whose commit lands but whose answer is lost' }],
  },
  {
    name: 'legacy-fanout-heartbeat-reads-job',
    removes: 'the owner-checked heartbeat for units of a fan-out recorded without unit IDs (a cancelled unit heartbeats on)',
    file: 'functions/src/engine/step/unit-step.ts',
    search: '  const legacyFanOut = job.fanout !== null && job.fanout.unitIds === undefined;\n',
    replace: '  const legacyFanOut = false as boolean;\n',
    tests: [{ files: ['test/emulator/unit-heartbeat.test.ts'], names: 'bug 16: a unit of a fan-out recorded without unit IDs' }],
  },
  {
    name: 'key-range-covers-every-id',
    removes: 'the exact upper bound of the per-step section and transcript range (prefix + U+F8FF misses IDs that go on with an emoji or a full-width letter)',
    file: 'functions/src/store/checkpoint-reads.ts',
    search: "'<', prefixSuccessor(prefix))",
    replace: "'<', `${prefix}\\uf8ff`)",
    tests: [{ files: ['test/emulator/conditioned-commits.test.ts'], names: 'bug 17:' }],
  },
  {
    name: 'no-op-owner-commit-reads',
    removes: 'the read before an owner commit with nothing to write (a remembered record answers for a claim that is gone)',
    file: 'functions/src/store/job-store.ts',
    search: "          if (!('fresh' in view)) {\n",
    replace: '          if (false as boolean) {\n',
    tests: [{ files: ['test/emulator/conditioned-commits.test.ts'], names: 'bug 18:' }],
  },
  {
    name: 'corrupt-transcript-log-refused',
    removes: 'refusing a transcript save that keeps more messages than the log holds (a tampered log loads as a shorter, wrong transcript)',
    file: 'functions/src/store/transcript-log.ts',
    search: "typeof save.keep !== 'number' || save.keep > kept.length ||",
    replace: "typeof save.keep !== 'number' ||",
    tests: [{ files: ['test/emulator/transcript-log.test.ts'], names: 'a save whose document was tampered with' }],
  },
  {
    name: 'artifact-hash-checked-on-load',
    removes: 'the SHA-256 check when an artifact is read (a tampered chunk of a page text or an offloaded tool result is returned as if it were the stored content)',
    file: 'functions/src/store/artifact-store.ts',
    search: '  if (actual !== ref.sha256) return',
    replace: '  if ((false as boolean) && actual !== ref.sha256) return',
    tests: [{ files: ['test/emulator/artifact-store.test.ts'], names: 'a tampered chunk is refused' }],
  },
  {
    name: 'circuit-read-expires',
    removes: 'the expiry of a process\'s remembered circuit (a circuit another worker opened is never seen)',
    file: 'functions/src/store/provider-circuit.ts',
    search: 'nowMs - known.atMs < freshnessMs',
    replace: '(true as boolean)',
    tests: [{ files: ['test/emulator/provider-circuit.test.ts'], names: 'another worker opens the circuit' }],
  },
  {
    name: 'retention-cursor-kept',
    removes: "the retention marker a sweep leaves on a job its budget ran out in (the job counts as stamped with documents that never expire)",
    file: 'functions/src/engine/retention.ts',
    search: 'position === null ? null : { dueAtMs: retention.dueAtMs, cursor: stampingCursor(position) }',
    replace: 'null',
    tests: [{ files: ['test/emulator/retention.test.ts'], names: "more expiring documents than one sweep's bound" }],
  },
  {
    name: 'quota-admitted-in-transaction',
    removes: "the submit transaction's own read of the user's usage document (an admission decided from a plain read: parallel submits all see room)",
    file: 'functions/src/store/quota-documents.ts',
    search: 'const [usageSnapshot, overrideSnapshot] = await tx.getAll(usageRef, limitsRef);',
    replace: 'const [usageSnapshot, overrideSnapshot] = [seenUsage, seenOverride];',
    tests: [{ files: ['test/emulator/quotas.test.ts'], names: 'parallel submits race for the last slots' }],
  },
  {
    name: 'stream-must-finish',
    removes: 'the refusal of a streamed answer that ended without a finish reason (half an answer returned as the answer)',
    file: 'functions/src/providers/openai-compatible.ts',
    search: '    if (answer.finishReason === null) {\n',
    replace: '    if ((false as boolean)) {\n',
    tests: [{ files: ['test/unit/provider-openai-streaming.test.ts'], names: 'ends cleanly but without a finish reason' }],
  },
  {
    name: 'drafts-streamed',
    removes: "the section runner's draft sink (the provider is never asked to stream: nothing appears before a section is recorded)",
    file: 'functions/src/agent/section-runner.ts',
    search: ', ...(onText ? { onText } : {}) });',
    replace: ' });',
    tests: [{ files: ['test/emulator/drafts.test.ts'], names: 'a streaming provider' }],
  },
  {
    name: 'spend-checked-before-call',
    removes: "the section runner's spend check before a model call (a job past its owner's daily cap goes on spending)",
    file: 'functions/src/agent/section-runner.ts',
    search: '      await this.deps.spend?.beforeCall();\n',
    replace: '',
    tests: [{ files: ['test/emulator/spend-cap.test.ts'], names: 'reaches the cap waits with a question' }],
  },
  {
    name: 'spend-charged',
    removes: "the section runner's charge of each call's cost to its owner's day (the cap never fills)",
    file: 'functions/src/agent/section-runner.ts',
    search: '      this.deps.spend?.charge(response.costUsd);\n',
    replace: '',
    tests: [{ files: ['test/emulator/spend-cap.test.ts'], names: 'wasted calls count' }],
  },
  {
    name: 'spend-charged-for-refused-answers',
    removes: "the section runner's charge of an answer the client refused after the provider billed it (no content, a content filter stop)",
    file: 'functions/src/agent/section-runner.ts',
    search: '        this.deps.spend?.charge(billedUsd);\n',
    replace: '',
    tests: [{ files: ['test/unit/spend-billed-failures.test.ts'], names: 'all three are charged|content filter is charged' }],
  },
  {
    name: 'spend-check-counts-unwritten',
    removes: "the spend meter's count of this step's charges not yet written (a failed charge is forgotten by the check)",
    file: 'functions/src/engine/spend-meter.ts',
    search: 'const spentUsd = today.spentUsd + this.unwrittenUsd;',
    replace: 'const spentUsd = today.spentUsd;',
    tests: [{ files: ['test/unit/spend-meter.test.ts'], names: 'could not be written still counts' }],
  },
];
