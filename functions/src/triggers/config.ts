/**
 * The engine options the triggers run with. Every variable is declared and parsed in
 * config/environment.ts; this path stays for the triggers and the local tools that import it.
 */
export { engineOptionsFromEnv } from '../config/environment';
