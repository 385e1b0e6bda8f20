/**
 * Where spans go, from configuration (the trace exporter, config/environment.ts):
 *
 * - `none` (the default): no tracer provider is registered, so every span is the OpenTelemetry
 *   API's no-op span and the SDK is not even loaded. Log lines still carry the request's trace.
 * - `console`: each finished span is one JSON log line (name, duration, parent, attributes,
 *   events, with the Cloud Logging trace fields), exported as it ends.
 * - `otlp`: spans are batched and sent as OTLP/HTTP to the configured URL (an
 *   OpenTelemetry Collector, which can forward them to Cloud Trace); the batch is flushed at the
 *   end of every step, before the function answers, since an idle instance may lose its CPU.
 *
 * Sampling is by trace ID (the configured ratio), the incoming request's sampled flag not
 * followed (Google's front end marks few requests sampled): every step of a trace is kept or
 * dropped alike, and a step's children follow the step.
 */
import { trace, type Tracer } from '@opentelemetry/api';
import type { Sampler } from '@opentelemetry/sdk-trace-base';
import { JsonLineSpanExporter } from './json-span-exporter';
import { TRACER_NAME } from './scope';

export const TRACE_EXPORTERS = ['none', 'console', 'otlp'] as const;

/** Where spans go, as configuration says (config/environment.ts reads it from the environment). */
export type TracingConfig =
  | { readonly exporter: 'none' }
  | { readonly exporter: 'console'; readonly sampleRatio: number }
  | { readonly exporter: 'otlp'; readonly url: string; readonly sampleRatio: number };

export interface Tracing {
  readonly exporter: TracingConfig['exporter'];
  /** The configured provider's tracer (the global no-op one for `none`). */
  readonly tracer: Tracer;
  /** Exports what is buffered, within `timeoutMs`; never throws. */
  flush(timeoutMs?: number): Promise<void>;
  shutdown(): Promise<void>;
}

export const NO_TRACING: Tracing = {
  exporter: 'none',
  tracer: trace.getTracer(TRACER_NAME),
  flush: () => Promise.resolve(),
  shutdown: () => Promise.resolve(),
};

export interface TracingOptions {
  /** `service.name` of the spans: the function's name. */
  readonly serviceName: string;
  /** For the trace fields of `console` lines. */
  readonly project?: string | undefined;
  /** Where `console` lines go (stdout by default). */
  readonly write?: (line: string) => void;
  /** Registers the provider as the global one (the default); tests keep it to themselves. */
  readonly register?: boolean;
}

/** The longest a step waits for its spans to be sent (a collector nearby answers in milliseconds). */
const FLUSH_TIMEOUT_MS = 2_000;

/**
 * Starts exporting as configured; `none` loads nothing and registers nothing. The SDK is loaded
 * only when spans are exported, so the default costs the function's cold start nothing.
 */
export async function startTracing(config: TracingConfig, options: TracingOptions): Promise<Tracing> {
  if (config.exporter === 'none') return NO_TRACING;
  const sdk = await import('@opentelemetry/sdk-trace-base');
  const { resourceFromAttributes } = await import('@opentelemetry/resources');
  const write = options.write ?? ((line: string) => process.stdout.write(`${line}\n`));
  const processor =
    config.exporter === 'console'
      ? new sdk.SimpleSpanProcessor(new JsonLineSpanExporter(write, options.project, (await import('@opentelemetry/core')).ExportResultCode.SUCCESS))
      : new sdk.BatchSpanProcessor(new (await import('@opentelemetry/exporter-trace-otlp-http')).OTLPTraceExporter({ url: config.url }));
  const byTraceId: Sampler = config.sampleRatio >= 1 ? new sdk.AlwaysOnSampler() : new sdk.TraceIdRatioBasedSampler(config.sampleRatio);
  const provider = new sdk.BasicTracerProvider({
    resource: resourceFromAttributes({ 'service.name': options.serviceName }),
    sampler: new sdk.ParentBasedSampler({ root: byTraceId, remoteParentSampled: byTraceId, remoteParentNotSampled: byTraceId }),
    spanProcessors: [processor],
  });
  if (options.register ?? true) trace.setGlobalTracerProvider(provider);
  return {
    exporter: config.exporter,
    tracer: provider.getTracer(TRACER_NAME),
    flush: async (timeoutMs = FLUSH_TIMEOUT_MS) => {
      try {
        await provider.forceFlush({ timeoutMillis: timeoutMs });
      } catch {
        // Spans that could not be sent in time are lost; the step's answer is not held up further.
      }
    },
    shutdown: () => provider.shutdown(),
  };
}
