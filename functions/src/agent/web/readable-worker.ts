/**
 * The worker thread that turns a page into readable text (readable-extractor.ts starts it): the
 * parse and Readability run here, so a page that takes long to read holds this thread, never the
 * step's event loop, and the extractor can terminate it at its time limit.
 */
import { parentPort } from 'node:worker_threads';
import { readableFromHtml, readableFromText } from './readable';
import type { ExtractionReply, ExtractionRequest } from './readable-extractor';

const port = parentPort;
if (port === null) throw new Error('readable-worker runs as a worker thread (see readable-extractor.ts)');

port.on('message', (request: ExtractionRequest) => {
  let reply: ExtractionReply;
  try {
    const page = request.kind === 'html' ? readableFromHtml(request.text) : readableFromText(request.text);
    reply = { id: request.id, ok: true, page };
  } catch (error) {
    reply = { id: request.id, ok: false, message: error instanceof Error ? error.message : String(error) };
  }
  port.postMessage(reply);
});
