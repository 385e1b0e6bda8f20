/**
 * The offline provider's bundled corpus: short original notes on durable computing (how long
 * work survives crashes, retries and overload). A TS module, not a data file, so the functions
 * build carries it with no file-system reads. Ids are stable: transcripts refer to them.
 */
export interface CorpusDocument {
  readonly id: string;
  readonly title: string;
  readonly text: string;
}

/**
 * Where a citation of a bundled document points: a stable https URL on a host that cannot exist
 * (`.invalid` is reserved for that), so a report cites the corpus like the web without linking
 * anywhere real.
 */
export const CORPUS_URL_BASE = 'https://corpus.phaseline.invalid/';

export function corpusDocumentUrl(id: string): string {
  return `${CORPUS_URL_BASE}${encodeURIComponent(id)}`;
}

export const CORPUS: readonly CorpusDocument[] = [
  {
    id: 'idempotency-keys',
    title: 'Idempotency keys',
    text: `An idempotency key is a name the caller chooses for one intended effect, such as "charge order 8812 once". The server remembers every key it has seen together with the outcome, so a second request carrying the same key returns the stored outcome instead of doing the work again. The key turns a blind retry into a safe question: did this already happen?

The key must be chosen before the first attempt and must travel with every retry. A key generated fresh on each attempt protects nothing, because every attempt then looks new. Good keys are derived from the business intent, for example a job identifier joined with a step name, rather than from a timestamp or a random number drawn at send time.

Keys need a lifetime. A payment provider may keep them for a day, a mail service for an hour. When a retry can arrive after the key has expired, the caller must first look the effect up in the system of record before trying again. Keys also need scope: the same key sent by two different accounts should not collide.`,
  },
  {
    id: 'leases-and-fencing',
    title: 'Leases and fencing tokens',
    text: `A lease is a lock with an expiry time. A worker that holds the lease may work on the resource until the lease runs out, and it must renew the lease before then if it needs more time. If the worker crashes, nobody has to notice the crash: the lease simply expires and another worker may take over.

Expiry alone is not safe. A worker can pause for a long garbage collection or a slow network call, wake up after its lease has expired, and still believe it is the owner. A fencing token fixes this. Every grant of the lease comes with a number that only ever grows, and the storage layer rejects any write that carries a number older than the newest one it has seen.

With fencing, two workers may compute the same step at the same time, but only the current holder can make the result durable. The stale worker's write fails, and it should stop quietly rather than retry. This is the difference between "only one worker runs" and "only one worker's result counts", and only the second can be guaranteed.`,
  },
  {
    id: 'checkpointing',
    title: 'Checkpointing long computations',
    text: `A checkpoint records that a piece of work is finished, in a form that a later process can trust without redoing it. Long computations are cut into units, and each completed unit is written down before the next one starts. After a crash, work resumes from the last checkpoint, so at most one unit is computed twice.

The grain of a checkpoint is a trade-off. Small units waste little work on a crash but cost more writes and more bookkeeping. Large units are cheap to record but expensive to lose. A natural grain is the smallest unit whose result is meaningful on its own, such as one section of a report or one page of a crawl.

A checkpoint is only useful if it is validated. A process that reads state written by an older version, or by a worker that died half way, must check the state against a schema and refuse anything that does not fit. Writing a checkpoint can also fail, and that failure must stop the step: a checkpoint that was silently lost makes the system promise work it cannot show.`,
  },
  {
    id: 'retry-backoff-jitter',
    title: 'Retries, backoff and jitter',
    text: `Most failures in distributed systems are brief: a connection reset, a busy server, a leader election. Retrying is the obvious cure, but retrying at once and forever turns a small outage into a large one, because every client hammers the recovering service at the same moment.

Exponential backoff spaces the attempts out, doubling the wait after each failure up to a ceiling. Jitter adds a random spread to each wait so that clients which failed together do not retry together. Full jitter, which picks a wait uniformly between zero and the current ceiling, spreads the load best, at the cost of an occasional quick retry.

A retry policy needs a budget as well as a rhythm. After a fixed number of attempts, or a fixed amount of elapsed time, the work should stop and report an explicit failure. Errors should also carry their own intent: a rate limit that says when to come back, a bad request that will never succeed, a timeout whose outcome is unknown. Matching on error message text is fragile; typed errors with codes are not.`,
  },
  {
    id: 'circuit-breakers',
    title: 'Circuit breakers',
    text: `A circuit breaker watches the calls made to a dependency and stops making them when too many fail. In the closed state calls pass through and failures are counted. When failures cross a threshold the breaker opens, and calls fail at once without touching the dependency. After a cooling period the breaker lets a few trial calls through, the half-open state, and closes again if they succeed.

The point of a breaker is to protect both sides. The failing service gets room to recover instead of a wall of retries, and the caller stops spending time and money on requests that will fail. Work that needed the dependency can be parked, shown as waiting, and resumed when the breaker closes.

A breaker shared by many workers is more useful than one per process, because a fleet of workers each discovering the outage separately still sends a burst of doomed calls. Shared breakers need a store that every worker reads, and their state should change on evidence from several calls rather than on a single failure.`,
  },
  {
    id: 'delivery-guarantees',
    title: 'At-least-once, at-most-once and the exactly-once myth',
    text: `A message system that never loses messages must sometimes deliver one twice. If a consumer processes a message and crashes before acknowledging it, the system cannot know whether the work happened, so it delivers the message again. This is at-least-once delivery. The alternative, acknowledging before processing, gives at-most-once delivery and loses the message when the consumer crashes.

Exactly-once execution of arbitrary code is not possible across a crash. What systems can offer is exactly-once effect: each message is processed at least once, and the effects are made idempotent or deduplicated so that a second processing changes nothing. The word "exactly" describes the visible result, never the number of times code ran.

Designing for at-least-once means assuming that anything after the last durable record will run again. Side effects need idempotency keys, state changes need conditions on the state they expect, and counters need care, because an increment applied twice is a silent error.`,
  },
  {
    id: 'sagas',
    title: 'Sagas and compensating actions',
    text: `A saga is a long business operation split into local steps, each with a compensating action that undoes its effect. Booking a trip might reserve a flight, then a hotel, then a car. If the car cannot be booked, the saga runs the compensations in reverse order: release the hotel, then the flight.

Compensation is not rollback. The flight reservation really existed for a while, and someone may have seen it. Compensations must therefore be designed as business actions in their own right, such as a refund instead of a deleted charge, and they must themselves be idempotent, because they can be retried like any other step.

Sagas need a durable log of which steps finished, so that a coordinator which crashes half way can tell whether to continue forward or to compensate. Steps whose outcome is unknown, for example a call that timed out, must be reconciled against the other system before the saga decides anything.`,
  },
  {
    id: 'transactional-outbox',
    title: 'The transactional outbox',
    text: `A service often needs to change its own database and tell the outside world about it. Doing the two separately is unsafe: the database write can succeed and the message fail, or the reverse. The transactional outbox solves this by writing the outgoing message into a table of the same database, inside the same transaction as the state change.

A separate relay reads the outbox and publishes each entry, marking it sent afterwards. If the relay crashes between publishing and marking, the entry is published again, so consumers must tolerate duplicates, usually by the entry's identifier. Giving each outbox entry a deterministic identifier, derived from what it announces, makes duplicates easy to recognise.

The outbox turns a distributed problem into a local one. The only atomic step is a single-database transaction, which every serious database supports, and everything after it is an at-least-once delivery that can be retried without fear.`,
  },
  {
    id: 'write-ahead-logs',
    title: 'Write-ahead logging',
    text: `A write-ahead log records what a system intends to change before it changes it. Databases append each modification to the log and force the log to disk before touching the data pages. After a crash, the system replays the log to redo changes that were logged but not yet applied, and undoes changes from transactions that never committed.

The log works because appending is simple and ordered. A half-written record at the end of the log can be detected with a checksum and discarded, while every complete record before it is trusted. Recovery is therefore a scan from the last known good point, not a search through the whole store.

The same idea appears far from databases. An agent that records each tool call and its result before acting on the result has a write-ahead log of its own reasoning. After a crash it can replay the recorded results instead of calling the tools again, which matters when a tool is slow, expensive or has side effects.`,
  },
  {
    id: 'heartbeats',
    title: 'Heartbeats and failure detection',
    text: `A heartbeat is a periodic signal that says "I am still alive and still working". A monitor that stops receiving heartbeats from a worker concludes, after a timeout, that the worker has failed and that its work should be given to someone else. The monitor cannot tell a dead worker from a slow one or from a broken network; it only knows the heartbeats stopped.

The heartbeat interval should be a fraction of the timeout, often a third, so that one lost heartbeat does not trigger a false alarm. Heartbeats can also carry progress, such as the number of items done, which lets the replacement worker or a person watching see how far the work got.

Heartbeats cost writes. In a store that limits writes per record, a heartbeat from every worker every second can exhaust the budget. Coalescing heartbeats with progress updates into one write per interval keeps the signal without the cost.`,
  },
  {
    id: 'poison-messages',
    title: 'Poison messages and quarantine',
    text: `A poison message is one that makes its consumer crash every time it is processed. Because the consumer dies before acknowledging, the message is delivered again, and the cycle repeats until someone notices. Meanwhile the poison message can block the queue behind it or burn the entire retry budget of the system.

The cure is to count failures per message and to move a message that has failed too often into a separate place, often called a dead-letter queue or quarantine. There it waits for a person, who can inspect it, fix the consumer and replay it. The count must survive the crashes it is counting, so it belongs in durable storage, not in the memory of the process that keeps dying.

Two counts are worth keeping apart. Errors the code caught and reported are ordinary failures with a retry budget. Work whose worker vanished without reporting anything, so that its lease simply expired, is a different signal, and several such expiries in a row are the clearest sign of a poison message.`,
  },
  {
    id: 'rate-limits',
    title: 'Rate limits and token buckets',
    text: `Services protect themselves with rate limits: a cap on requests, or on units of work such as tokens, per interval. A token bucket is the common model. The bucket fills at a steady rate up to a capacity, each request takes tokens out, and a request that finds the bucket empty is refused or delayed. The capacity allows short bursts while the fill rate bounds the average.

A refused request usually comes back as HTTP status 429 with a Retry-After header, given either as a number of seconds or as a date. A well-behaved client honours that hint instead of its own backoff schedule, because the server knows when capacity will return.

Rate limits often hit many clients at once. When a shared model provider starts refusing requests, every worker in a fleet sees the refusals within seconds. Treating the limit as a property of the provider, shared by all workers, avoids each worker learning the same lesson independently.`,
  },
  {
    id: 'clocks-and-time',
    title: 'Clocks, skew and timeouts',
    text: `Every machine has its own clock, and no two agree exactly. Clocks drift, jump when they are corrected, and can even run backwards. A system that compares timestamps written by different machines must allow for this skew, usually by adding a margin to every expiry it checks.

Timeouts are guesses about how long something should take. A timeout that is too short declares healthy but slow work dead and starts it again, doubling the load. A timeout that is too long leaves users waiting on work that will never finish. Good timeouts come from measured latencies, with room for the slow tail.

Code that reads the time directly is hard to test. Injecting a clock, an object whose only job is to say what time it is, lets tests move time forward by hand and check expiry, backoff and scheduling without sleeping. The same idea applies to randomness: a seeded random source makes jitter reproducible.`,
  },
  {
    id: 'event-sourcing',
    title: 'Event sourcing and replay',
    text: `Event sourcing stores the history of changes rather than the current state. Each change is an event appended to a log, such as "item added" or "payment received", and the current state is computed by replaying the events in order. Nothing is overwritten, so the full history is always available for audit and debugging.

Replay must be deterministic. If computing the state from the events consults the current time, a random number or an outside service, two replays can disagree. Event-sourced systems keep such inputs out of the replay by recording them as events themselves at the moment they are first observed.

Durable workflow engines use the same technique for code. They record the result of every step, and after a crash they rerun the workflow function from the start, feeding it the recorded results instead of executing the steps again. This only works if the workflow code makes the same decisions given the same recorded results.`,
  },
  {
    id: 'backpressure',
    title: 'Backpressure and load shedding',
    text: `A system under more load than it can handle has three choices: buffer the excess, slow the senders down, or refuse some of the work. Buffering only delays the problem and raises latency for everyone. Backpressure, slowing the senders, pushes the problem upstream to where it can be handled, for example by making a queue stop handing out tasks.

Load shedding refuses work early and cheaply, before resources are spent on it. A service that answers quickly with "busy, try later" stays healthy for the requests it accepts, while one that accepts everything may time out on all of them. Shedding is most useful when the refused work can be retried later with a clear hint.

Queues that dispatch work at a bounded rate are a simple form of backpressure. The rate and the concurrency limit of a task queue decide how fast work reaches the workers, whatever the rate at which it was submitted.`,
  },
  {
    id: 'agent-transcripts',
    title: 'Durable transcripts for tool-using agents',
    text: `A tool-using language model agent works in turns. The model reads the conversation so far and either answers or asks for one or more tool calls; the caller runs the tools and appends their results, and the model takes another turn. The conversation, called the transcript, is the agent's whole memory of the task.

A transcript is only sound when every tool call the model asked for has a recorded result. A transcript that ends with an unanswered call cannot be sent back to most model APIs, and guessing the missing result would feed the model a fiction. After a crash, the caller must either run the missing calls or cut the transcript back to the last point where it was complete.

Recording each tool result durably before the next model turn means a restarted worker can continue the same conversation without repeating searches or actions. When the transcript is lost or damaged, the work can instead restart cleanly from the section prompt, which costs tokens but never repeats a recorded effect.`,
  },
];
