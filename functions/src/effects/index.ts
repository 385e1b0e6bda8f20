export * from './ledger';
export * from './keys';
export * from './port';
export * from './reconcile';
export * from './protocol';
export * from './http-adapter';
export * from './firestore-ledger';
export * from './after-stop';
