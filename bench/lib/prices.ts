/**
 * Firestore list prices the cost model uses (Standard edition, USD per 100,000 documents, beyond
 * the daily free quota of 50,000 reads, 20,000 writes and 20,000 deletes, which the model leaves
 * out). Storage, network, index-entry reads and the Cloud Tasks and Cloud Functions bills are not
 * in it.
 *
 * Source: https://cloud.google.com/firestore/pricing ("Pricing by location"). That table is filled
 * in by the page at view time and was not in the copies of it that could be read while writing
 * this, so the figures below are stated, not re-checked for each run:
 * - nam5 (the United States multi-region): $0.06 reads, $0.18 writes, $0.02 deletes, the
 *   multi-region prices as Firebase's pricing page has long listed them;
 * - a single US region (us-central1): $0.03 reads and $0.09 writes, as third-party guides quote the
 *   page for US regions; $0.01 deletes is an assumption (half the multi-region price, as reads and
 *   writes are).
 * Check the page before quoting a cost; the bench prints the prices beside every figure.
 */
export interface FirestorePrices {
  readonly location: string;
  /** USD per 100,000 documents. */
  readonly read: number;
  readonly write: number;
  readonly delete: number;
}

export const FIRESTORE_PRICES: readonly FirestorePrices[] = [
  { location: 'nam5 (US multi-region)', read: 0.06, write: 0.18, delete: 0.02 },
  { location: 'us-central1 (single region)', read: 0.03, write: 0.09, delete: 0.01 },
];

export const FIRESTORE_PRICES_SOURCE =
  'https://cloud.google.com/firestore/pricing (Standard edition, per 100,000 documents beyond the free quota); ' +
  'nam5 as the page lists multi-region prices, us-central1 reads and writes as quoted for US regions, its delete price assumed (half of nam5\'s); not re-checked at run time';

/** Firestore's guidance for one document: about one sustained write per second. */
export const DOCUMENT_SUSTAINED_WRITES_PER_SECOND = 1;
