// Types of rebate-client.mjs, the reference client for H5 pages (docs/CLIENTS.md).

/** How a part's data was obtained. */
export type Served = "live" | "stale" | "template";

export interface DegradedPart {
  part: "product" | "rate" | "coupons" | "extras";
  reason: string;
  served: Served;
  /** For `stale` data: when it was fetched (RFC 3339). */
  as_of: string | null;
}

/** The service's quote, as `GET /api/v1/items/{platform}/{item_id}/rebate` answers it. */
export interface Quote {
  item: {
    platform: string;
    item_id: string;
    title: string;
    price_cents: number;
    image_url?: string;
    shop_name?: string;
  };
  rebate: {
    rate_bps: number | null;
    estimated_cents: number | null;
    source: Served;
    as_of: string | null;
  };
  coupons: Array<{
    coupon_id: string;
    discount_cents: number;
    threshold_cents: number;
    expires_at: string;
  }>;
  extras: Record<string, unknown> | null;
  degraded: boolean;
  degraded_parts: DegradedPart[];
  /** Fixed texts to show for degraded parts. */
  notices: string[];
  trace_id: string;
}

export type ErrorKind =
  | "not_found"
  | "invalid"
  | "unauthorized"
  | "overloaded"
  | "failed"
  | "throttled"
  | "aborted";

export class RebateError extends Error {
  readonly kind: ErrorKind;
  /** The HTTP status (0 for a network error, a local refusal or a cancellation). */
  readonly status: number;
  /** The service's error code (`rate_limited`, `overloaded`, `item_not_found`, …). */
  readonly code: string;
  readonly traceId: string;
  /** What the server's `Retry-After` asked for, in milliseconds (0: none). */
  readonly retryAfterMs: number;
}

export interface Answer {
  quote: Quote;
  /** `network`: a 200; `revalidated`: a 304; `last_good`: the server could not answer. */
  source: "network" | "revalidated" | "last_good";
  /** The oldest time the data is from, in ms since the epoch. */
  asOf: number;
  /** The "data as of …" text to show when the data is not live, else null. */
  banner: string | null;
  /** Requests this call made (local refusals included). */
  attempts: number;
  traceId: string;
  /** With `last_good`: why the server could not answer. */
  error?: RebateError;
}

export interface Clock {
  now(): number;
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

export interface Options {
  maxAttempts?: number;
  baseDelayMs?: number;
  maxDelayMs?: number;
  budgetMs?: number;
  retryAfterJitter?: number;
  throttleK?: number;
  throttleWindowMs?: number;
  cacheEntries?: number;
}

export const DEFAULTS: Readonly<Required<Options>>;
export const systemClock: Clock;

export interface ClientConfig extends Options {
  /** The API's origin, e.g. `https://api.example.com`. */
  baseUrl: string;
  /** One per install, kept across sessions: the server limits each client by it. */
  clientId?: string;
  fetch?: typeof globalThis.fetch;
  clock?: Clock;
  random?: () => number;
}

export interface CallOptions {
  signal?: AbortSignal;
  /** `page` (default) for what the user waits for; `prefetch` for a guess at the next screen. */
  requestClass?: "page" | "list" | "prefetch";
  /** A place on the page: a new call for the same view cancels the one before. */
  view?: string;
  /**
   * Called at most once, with the kept quote and its banner, when the call must wait before it
   * can answer (a `Retry-After`, a back-off): show it at once instead of a spinner.
   */
  onStale?: (answer: Answer) => void;
}

export class RebateClient {
  constructor(config: ClientConfig);
  readonly stats: {
    calls: number;
    requests: number;
    retries: number;
    throttled: number;
    lastGood: number;
    notModified: number;
  };
  getRebate(platform: string, itemId: string, options?: CallOptions): Promise<Answer>;
}

export class AdaptiveThrottle {
  constructor(options?: { k?: number; windowMs?: number; buckets?: number });
  rejectProbability(nowMs: number): number;
  /** Whether to send the next request; a local refusal counts as a request at once. */
  admit(nowMs: number, random: () => number): boolean;
  /** A request sent got its answer: `accepted` unless refused for load or unreachable. */
  answered(nowMs: number, accepted: boolean): void;
}

export function parseRetryAfter(value: string | null | undefined, nowMs: number): number | null;
export function backoffDelay(
  retry: number,
  retryAfterMs: number | null,
  options: Required<Options>,
  random: () => number,
): number;
export function oldestAsOf(quote: Quote, receivedAt: number): number;
