export * from './ledger';
export * from '../core/effect-keys';
export * from './port';
export * from './reconcile';
export * from './protocol';
export * from './http-adapter';
export * from './after-stop';
