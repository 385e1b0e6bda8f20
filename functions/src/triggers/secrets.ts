/**
 * The secrets the step function binds at deploy, each only when its backend is configured (an
 * unbound secret is not asked for at deploy, so the offline default and the emulators need none).
 * Their values reach the function as environment variables, read by config/environment.ts.
 */
import { defineSecret } from 'firebase-functions/params';
import { MODEL_API_KEY_VARIABLE, TAVILY_API_KEY_VARIABLE, modelApiKeyNeeded, tavilyApiKeyNeeded } from '../config/environment';

/** Bound to the step function only for the keyed provider. */
export const modelApiKey = defineSecret(MODEL_API_KEY_VARIABLE);
/** Bound to the step function only when the search backend is Tavily. */
export const tavilyApiKey = defineSecret(TAVILY_API_KEY_VARIABLE);

/** The secrets the configuration (read at deploy from functions/.env.<project>) needs. */
export function stepSecrets(): ReturnType<typeof defineSecret>[] {
  return [...(modelApiKeyNeeded() ? [modelApiKey] : []), ...(tavilyApiKeyNeeded() ? [tavilyApiKey] : [])];
}
