// The reference client for H5 pages: the client contract of docs/CLIENTS.md, in one
// dependency-free ES module. Everything that varies — the clock, the random source, fetch — is
// injected, so that its tests run the contract's timing without waiting.

/** Statuses answered by backing off and degrading: the server or the path is overloaded. */
const BACK_OFF = new Set([429, 502, 503, 504]);
/** Statuses never retried: the request itself is wrong, or the answer is final. */
const FINAL = new Set([400, 401, 403, 404, 405, 413, 414, 415, 431]);

/** The contract's defaults (docs/CLIENTS.md, "Attempts and back-off"). */
export const DEFAULTS = Object.freeze({
  /** Attempts per call, the first included. */
  maxAttempts: 3,
  /** The first back-off's ceiling; each later one doubles, up to `maxDelayMs`. */
  baseDelayMs: 250,
  maxDelayMs: 8000,
  /** A call gives up (and falls back) rather than wait past this, however long Retry-After says. */
  budgetMs: 10000,
  /** A `Retry-After` is waited for in full, plus up to this share of it at random. */
  retryAfterJitter: 0.5,
  /** The adaptive throttle: K and its sliding window. */
  throttleK: 2,
  throttleWindowMs: 120000,
  /** Quotes kept for revalidation and fallback. */
  cacheEntries: 200,
});

/** Why a call ended without a quote. */
export class RebateError extends Error {
  constructor(kind, message, { status = 0, code = "", traceId = "", retryAfterMs = 0 } = {}) {
    super(message);
    this.name = "RebateError";
    /** `not_found`, `invalid`, `unauthorized`, `overloaded`, `failed`, `throttled` or `aborted`. */
    this.kind = kind;
    this.status = status;
    this.code = code;
    this.traceId = traceId;
    this.retryAfterMs = retryAfterMs;
  }
}

/**
 * Milliseconds a `Retry-After` value asks for: delta-seconds or an HTTP date (RFC 9110
 * §10.2.3), relative to `nowMs`; null when absent or unreadable. Never negative.
 */
export function parseRetryAfter(value, nowMs) {
  if (value === null || value === undefined) return null;
  const text = String(value).trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const at = Date.parse(text);
  if (Number.isNaN(at)) return null;
  return Math.max(0, at - nowMs);
}

/**
 * The wait before attempt `retry` (1 for the first retry): "full jitter", a uniform draw in
 * [0, min(maxDelayMs, baseDelayMs · 2^(retry − 1))], and never less than what the server's
 * `Retry-After` asked for (that one is waited in full, plus up to `retryAfterJitter` of it, so
 * that clients told the same instant do not return together).
 */
export function backoffDelay(retry, retryAfterMs, options, random) {
  const ceiling = Math.min(options.maxDelayMs, options.baseDelayMs * 2 ** (retry - 1));
  const drawn = random() * ceiling;
  if (retryAfterMs === null || retryAfterMs === undefined) return drawn;
  return Math.max(drawn, retryAfterMs * (1 + random() * options.retryAfterJitter));
}

/**
 * Adaptive throttling (Google SRE book, "Handling Overload"): over a sliding window, refuse a
 * request locally with probability max(0, (requests − K · accepts) / (requests + 1)). A request
 * counts as accepted unless the server refused it for load (429, 503) or could not be reached;
 * local refusals count as requests, so a client that keeps being refused sends less and less. A
 * request sent counts when its answer comes: one cancelled in flight (the user moved on) says
 * nothing about the server and counts for nothing.
 */
export class AdaptiveThrottle {
  constructor({ k = DEFAULTS.throttleK, windowMs = DEFAULTS.throttleWindowMs, buckets = 60 } = {}) {
    this.k = k;
    this.bucketMs = windowMs / buckets;
    this.buckets = Array.from({ length: buckets }, () => ({ slot: -1, requests: 0, accepts: 0 }));
  }

  bucket(nowMs) {
    const slot = Math.floor(nowMs / this.bucketMs);
    const bucket = this.buckets[slot % this.buckets.length];
    if (bucket.slot !== slot) {
      bucket.slot = slot;
      bucket.requests = 0;
      bucket.accepts = 0;
    }
    return bucket;
  }

  totals(nowMs) {
    const oldest = Math.floor(nowMs / this.bucketMs) - this.buckets.length + 1;
    let requests = 0;
    let accepts = 0;
    for (const bucket of this.buckets) {
      if (bucket.slot >= oldest) {
        requests += bucket.requests;
        accepts += bucket.accepts;
      }
    }
    return { requests, accepts };
  }

  /** The probability of refusing the next request locally. */
  rejectProbability(nowMs) {
    const { requests, accepts } = this.totals(nowMs);
    return Math.max(0, (requests - this.k * accepts) / (requests + 1));
  }

  /** Whether to send the next request. A local refusal counts at once. */
  admit(nowMs, random) {
    if (random() < this.rejectProbability(nowMs)) {
      this.bucket(nowMs).requests += 1;
      return false;
    }
    return true;
  }

  /** A request sent was answered (or failed on the network); `accepted` unless refused for load. */
  answered(nowMs, accepted) {
    const bucket = this.bucket(nowMs);
    bucket.requests += 1;
    if (accepted) bucket.accepts += 1;
  }
}

/** The real clock: `now()` in ms and an abortable `sleep`. */
export const systemClock = Object.freeze({
  now: () => Date.now(),
  sleep: (ms, signal) =>
    new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(abortError(signal));
      const timer = setTimeout(() => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      }, ms);
      const onAbort = () => {
        clearTimeout(timer);
        reject(abortError(signal));
      };
      signal?.addEventListener("abort", onAbort, { once: true });
    }),
});

function abortError(signal) {
  return new RebateError("aborted", String(signal?.reason ?? "the call was cancelled"));
}

/**
 * One H5 page's client of the rebate API. `getRebate` returns
 * `{ quote, source, asOf, banner, attempts, traceId }`:
 * - `source` is `network` (a 200), `revalidated` (a 304: the kept quote is current) or
 *   `last_good` (the server could not answer; the kept quote stands in, with `banner` set);
 * - `asOf` is the oldest time the quote's data is from (its parts' `as_of`, or when it was
 *   received), and `banner` the "data as of …" text to show whenever it is not live.
 * It throws a `RebateError` when there is nothing to show.
 */
export class RebateClient {
  constructor({
    baseUrl,
    clientId,
    fetch = globalThis.fetch?.bind(globalThis),
    clock = systemClock,
    random = Math.random,
    ...options
  }) {
    if (!baseUrl) throw new TypeError("baseUrl is required");
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.clientId = clientId;
    this.fetch = fetch;
    this.clock = clock;
    this.random = random;
    this.options = { ...DEFAULTS, ...options };
    this.throttle = new AdaptiveThrottle({
      k: this.options.throttleK,
      windowMs: this.options.throttleWindowMs,
    });
    /** url → { etag, quote, receivedAt }, least recently used first. */
    this.cache = new Map();
    /** view → AbortController of its call in flight. */
    this.views = new Map();
    /** No request before this time (ms): the server's last `Retry-After`, for every call. */
    this.notBefore = 0;
    /** Counts since the page loaded: what a page reports with its own telemetry. */
    this.stats = { calls: 0, requests: 0, retries: 0, throttled: 0, lastGood: 0, notModified: 0 };
  }

  /**
   * The rebate of one item. Options: `signal` (an AbortSignal), `requestClass` (`page` by
   * default; `prefetch` for a guess at the next screen, which the server sheds first), and
   * `view`: a name for the place on the page the answer goes to — a new call for the same view
   * cancels the one before (the user moved on). `onStale(answer)`: called at most once, with
   * the kept quote and its banner, when the call must wait before it can answer (a
   * `Retry-After`, a back-off), so that the page shows it at once instead of a spinner; the
   * promise still settles with the call's final answer.
   */
  async getRebate(platform, itemId, { signal, requestClass = "page", view, onStale } = {}) {
    const path = `/api/v1/items/${encodeURIComponent(platform)}/${encodeURIComponent(itemId)}/rebate`;
    let controller;
    if (view !== undefined) {
      this.views.get(view)?.abort("superseded");
      controller = new AbortController();
      this.views.set(view, controller);
      signal?.addEventListener("abort", () => controller.abort(signal.reason), { once: true });
      signal = controller.signal;
    }
    try {
      return await this.call(`${this.baseUrl}${path}`, requestClass, signal, onStale);
    } finally {
      if (view !== undefined && this.views.get(view) === controller) this.views.delete(view);
    }
  }

  async call(url, requestClass, signal, onStale) {
    this.stats.calls += 1;
    const stale = { shown: false };
    const started = this.clock.now();
    let lastError = null;
    let allowedAttempts = this.options.maxAttempts;
    let attempt = 0;
    while (attempt < allowedAttempts) {
      attempt += 1;
      if (signal?.aborted) throw abortError(signal);
      if (attempt > 1) this.stats.retries += 1;
      // A Retry-After holds for every call, not only the one that got it: wait it out if the
      // budget allows, else answer with what is kept, sending nothing.
      const held = this.notBefore - this.clock.now();
      if (held > 0) {
        const wait = held * (1 + this.random() * this.options.retryAfterJitter);
        if (this.clock.now() - started + wait > this.options.budgetMs) {
          this.stats.throttled += 1;
          lastError ??= new RebateError("overloaded", "the server asked to wait", {
            retryAfterMs: held,
          });
          return this.fallBack(url, lastError, attempt);
        }
        this.showStale(url, onStale, stale);
        await this.clock.sleep(wait, signal);
      }
      if (!this.throttle.admit(this.clock.now(), this.random)) {
        this.stats.throttled += 1;
        // The server's last refusal says more (and carries its Retry-After) than our own.
        lastError ??= new RebateError("throttled", "refused locally: the server keeps refusing");
      } else {
        const outcome = await this.attempt(url, requestClass, signal);
        if (outcome.done) return { ...outcome.done, attempts: attempt };
        lastError = outcome.error;
        if (outcome.final) break;
        // A 500 is retried once at most: it may be a bug, not load.
        if (outcome.error.status === 500) allowedAttempts = Math.min(allowedAttempts, 2);
      }
      if (attempt >= allowedAttempts) break;
      const delay = backoffDelay(attempt, lastError.retryAfterMs || null, this.options, this.random);
      if (this.clock.now() - started + delay > this.options.budgetMs) break;
      this.showStale(url, onStale, stale);
      await this.clock.sleep(delay, signal);
    }
    return this.fallBack(url, lastError, attempt);
  }

  /** Before a wait: the kept quote to `onStale`, once per call. */
  showStale(url, onStale, stale) {
    const kept = this.cache.get(url);
    if (!onStale || stale.shown || !kept) return;
    stale.shown = true;
    onStale(this.answer(kept.quote, "last_good", kept.receivedAt, ""));
  }

  /** One request: `{done}` with the answer, or `{error, final}`. */
  async attempt(url, requestClass, signal) {
    this.stats.requests += 1;
    const headers = { accept: "application/json", "x-request-class": requestClass };
    if (this.clientId) headers["x-client-id"] = this.clientId;
    const kept = this.cache.get(url);
    if (kept?.etag) headers["if-none-match"] = kept.etag;
    let response;
    try {
      response = await this.fetch(url, { headers, signal });
    } catch (cause) {
      if (signal?.aborted) throw abortError(signal);
      // A network error: the server was not reached. Back off, and let the throttle count it.
      this.throttle.answered(this.clock.now(), false);
      return { error: new RebateError("failed", `network error: ${cause?.message ?? cause}`) };
    }
    const now = this.clock.now();
    const status = response.status;
    const traceId = response.headers.get("x-trace-id") ?? "";
    this.throttle.answered(now, status !== 429 && status !== 503);
    if (status === 304 && kept) {
      this.touch(url, kept);
      this.stats.notModified += 1;
      return { done: this.answer(kept.quote, "revalidated", kept.receivedAt, traceId) };
    }
    if (status === 200) {
      const quote = await response.json();
      this.keep(url, { etag: response.headers.get("etag"), quote, receivedAt: now });
      return { done: this.answer(quote, "network", now, traceId) };
    }
    const body = await response.json().catch(() => ({}));
    const code = body?.error?.code ?? "";
    const message = body?.error?.message ?? `HTTP ${status}`;
    const retryAfterMs = parseRetryAfter(response.headers.get("retry-after"), now);
    if (retryAfterMs !== null && (status === 429 || status === 503)) {
      this.notBefore = Math.max(this.notBefore, now + retryAfterMs);
    }
    const details = { status, code, traceId, retryAfterMs: retryAfterMs ?? 0 };
    if (status === 404) {
      // The item is gone: its kept quote must not stand in for it.
      this.cache.delete(url);
      return { error: new RebateError("not_found", message, details), final: true };
    }
    if (status === 401 || status === 403) {
      return { error: new RebateError("unauthorized", message, details), final: true };
    }
    if (FINAL.has(status) || (status >= 400 && status < 500 && status !== 408 && status !== 429)) {
      return { error: new RebateError("invalid", message, details), final: true };
    }
    if (BACK_OFF.has(status) || status === 408) {
      return { error: new RebateError("overloaded", message, details) };
    }
    return { error: new RebateError("failed", message, details) };
  }

  /** The kept quote with a banner when the server could not answer; else the error. */
  fallBack(url, error, attempts) {
    const kept = this.cache.get(url);
    const serverCouldNotAnswer = !error || !["not_found", "invalid", "unauthorized"].includes(error.kind);
    if (kept && serverCouldNotAnswer) {
      this.stats.lastGood += 1;
      const answer = this.answer(kept.quote, "last_good", kept.receivedAt, error?.traceId ?? "");
      return { ...answer, attempts, error };
    }
    throw error ?? new RebateError("failed", "no attempt was made");
  }

  answer(quote, source, receivedAt, traceId) {
    const asOf = oldestAsOf(quote, receivedAt);
    // Not live: the kept answer, or a part the server served from a stale copy. A `template`
    // part has no data and no time; its notice says so.
    const stale =
      source === "last_good" ||
      quote?.rebate?.source === "stale" ||
      (quote?.degraded_parts ?? []).some((part) => part.served === "stale");
    return {
      quote,
      source,
      asOf,
      banner: stale ? `数据更新于 ${formatTime(asOf)} · data as of ${new Date(asOf).toISOString()}` : null,
      traceId,
    };
  }

  keep(url, entry) {
    this.cache.delete(url);
    this.cache.set(url, entry);
    while (this.cache.size > this.options.cacheEntries) {
      this.cache.delete(this.cache.keys().next().value);
    }
  }

  touch(url, entry) {
    this.cache.delete(url);
    this.cache.set(url, entry);
  }
}

/** The oldest `as_of` among the rebate and the degraded parts, else when it was received (ms). */
export function oldestAsOf(quote, receivedAt) {
  const stamps = [quote?.rebate?.as_of, ...(quote?.degraded_parts ?? []).map((part) => part.as_of)]
    .filter(Boolean)
    .map((text) => Date.parse(text))
    .filter((ms) => !Number.isNaN(ms));
  return stamps.length ? Math.min(receivedAt, ...stamps) : receivedAt;
}

function formatTime(ms) {
  const date = new Date(ms);
  const pad = (n) => String(n).padStart(2, "0");
  return `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
}
