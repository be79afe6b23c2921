// The reference client's contract, on a fake clock, a seeded random source and a fake fetch:
// `node --test clients/h5/test/`.
import { test } from "node:test";
import assert from "node:assert/strict";

import {
  AdaptiveThrottle,
  DEFAULTS,
  RebateClient,
  RebateError,
  backoffDelay,
  parseRetryAfter,
} from "../rebate-client.mjs";

/** mulberry32: a small seeded generator, so every run draws the same numbers. */
function seeded(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Virtual time: `sleep` moves `now` on at once and records the wait. */
function fakeClock(start = Date.parse("2026-12-06T12:00:00Z")) {
  const clock = {
    nowMs: start,
    slept: [],
    now: () => clock.nowMs,
    sleep: async (ms, signal) => {
      if (signal?.aborted) throw new RebateError("aborted", "cancelled");
      clock.slept.push(ms);
      clock.nowMs += ms;
      await Promise.resolve();
      if (signal?.aborted) throw new RebateError("aborted", "cancelled");
    },
  };
  return clock;
}

const QUOTE = {
  item: { platform: "taobao", item_id: "100001", title: "t", price_cents: 12900 },
  rebate: { rate_bps: 850, estimated_cents: 1011, source: "live", as_of: "2026-12-06T11:59:00Z" },
  coupons: [],
  extras: null,
  degraded: false,
  degraded_parts: [],
  notices: [],
  trace_id: "4bf92f3577b34da6a3ce929d0e0e4736",
};

function json(status, body, headers = {}) {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json", ...headers },
  });
}

function error(status, code, headers = {}) {
  return json(status, { error: { code, message: code }, trace_id: "0".repeat(32) }, headers);
}

/** A fetch that answers from `script` in turn (the last one repeats) and records requests. */
function scripted(...script) {
  const calls = [];
  const fetch = async (url, init) => {
    calls.push({ url, headers: init.headers });
    if (init.signal?.aborted) throw new DOMException("aborted", "AbortError");
    const next = script.length > 1 ? script.shift() : script[0];
    if (next instanceof Error) throw next;
    // A clone, so that a repeated answer still has its body.
    return next.clone();
  };
  return { fetch, calls };
}

function client(fetch, extra = {}) {
  return new RebateClient({
    baseUrl: "http://api.test",
    clientId: "install-1",
    fetch,
    clock: fakeClock(),
    random: seeded(42),
    ...extra,
  });
}

test("back-off is full jitter under a doubling ceiling, capped", () => {
  const random = seeded(7);
  for (const retry of [1, 2, 3, 4, 10]) {
    const ceiling = Math.min(DEFAULTS.maxDelayMs, DEFAULTS.baseDelayMs * 2 ** (retry - 1));
    const draws = Array.from({ length: 4000 }, () => backoffDelay(retry, null, DEFAULTS, random));
    assert.ok(draws.every((ms) => ms >= 0 && ms <= ceiling), `retry ${retry} within [0, ${ceiling}]`);
    const mean = draws.reduce((sum, ms) => sum + ms, 0) / draws.length;
    assert.ok(Math.abs(mean - ceiling / 2) < ceiling * 0.05, `retry ${retry}: mean ${mean} ≈ ${ceiling / 2}`);
    // Spread over the whole range: each quarter holds about a quarter of the draws.
    for (let quarter = 0; quarter < 4; quarter += 1) {
      const share =
        draws.filter((ms) => ms >= (quarter * ceiling) / 4 && ms < ((quarter + 1) * ceiling) / 4).length /
        draws.length;
      assert.ok(share > 0.2 && share < 0.3, `retry ${retry}, quarter ${quarter}: ${share}`);
    }
  }
});

test("a Retry-After is waited in full, plus up to half of it", () => {
  const random = seeded(9);
  const waits = Array.from({ length: 2000 }, () => backoffDelay(1, 3000, DEFAULTS, random));
  assert.ok(waits.every((ms) => ms >= 3000 && ms <= 4500));
  assert.ok(Math.max(...waits) > 4300 && Math.min(...waits) < 3200, "the jitter is spread");
});

test("Retry-After is read in both forms", () => {
  const now = Date.parse("2026-12-06T12:00:00Z");
  assert.equal(parseRetryAfter("3", now), 3000);
  assert.equal(parseRetryAfter(" 0 ", now), 0);
  assert.equal(parseRetryAfter("Sun, 06 Dec 2026 12:00:07 GMT", now), 7000);
  assert.equal(parseRetryAfter("Sun, 06 Dec 2026 11:59:00 GMT", now), 0, "a date past is now");
  assert.equal(parseRetryAfter("soon", now), null);
  assert.equal(parseRetryAfter(null, now), null);
});

test("the throttle refuses with probability max(0, (requests − K·accepts)/(requests + 1))", () => {
  const throttle = new AdaptiveThrottle({ k: 2, windowMs: 60000 });
  const now = 1_000_000;
  assert.equal(throttle.rejectProbability(now), 0);
  // 10 requests, 5 accepted: 10 − 2·5 = 0.
  for (let index = 0; index < 10; index += 1) {
    assert.equal(throttle.admit(now, () => 1), true);
    throttle.answered(now, index < 5);
  }
  assert.equal(throttle.rejectProbability(now), 0);
  // 10 more, none accepted: (20 − 10) / 21.
  for (let index = 0; index < 10; index += 1) throttle.answered(now, false);
  assert.equal(throttle.rejectProbability(now), 10 / 21);
  // A request admitted but never answered (cancelled in flight) counts for nothing.
  throttle.admit(now, () => 1);
  assert.equal(throttle.rejectProbability(now), 10 / 21);
  // The window slides: a minute later the counts are gone.
  assert.equal(throttle.rejectProbability(now + 61000), 0);
  // Refusals follow the probability.
  const random = seeded(3);
  const busy = new AdaptiveThrottle({ k: 2, windowMs: 60000 });
  for (let index = 0; index < 100; index += 1) busy.answered(now, false);
  const expected = busy.rejectProbability(now);
  let refused = 0;
  for (let index = 0; index < 1000; index += 1) {
    const p = busy.rejectProbability(now);
    if (!busy.admit(now, random)) refused += 1;
    assert.ok(p >= expected - 1e-9, "with no accepts the probability only grows");
  }
  assert.ok(refused > 900, `${refused} of 1000 refused locally`);
});

test("a 200 is kept; the next call revalidates with If-None-Match and a 304 serves it", async () => {
  const { fetch, calls } = scripted(
    json(200, QUOTE, { etag: '"v1"', "x-trace-id": "a".repeat(32) }),
    new Response(null, { status: 304, headers: { etag: '"v1"' } }),
  );
  const api = client(fetch);
  const first = await api.getRebate("taobao", "100001");
  assert.equal(first.source, "network");
  assert.equal(first.banner, null);
  assert.equal(calls[0].headers["x-client-id"], "install-1");
  assert.equal(calls[0].headers["x-request-class"], "page");
  assert.equal(calls[0].headers["if-none-match"], undefined);
  const second = await api.getRebate("taobao", "100001", { requestClass: "prefetch" });
  assert.equal(second.source, "revalidated");
  assert.deepEqual(second.quote, QUOTE);
  assert.equal(calls[1].headers["if-none-match"], '"v1"');
  assert.equal(calls[1].headers["x-request-class"], "prefetch");
  assert.equal(api.stats.notModified, 1);
});

test("503 with Retry-After: bounded attempts, then the last good answer with a banner", async () => {
  const { fetch, calls } = scripted(
    json(200, QUOTE, { etag: '"v1"' }),
    error(503, "overloaded", { "retry-after": "2" }),
  );
  const api = client(fetch);
  await api.getRebate("taobao", "100001");
  const clock = api.clock;
  const answer = await api.getRebate("taobao", "100001");
  assert.equal(answer.source, "last_good");
  assert.deepEqual(answer.quote, QUOTE);
  assert.match(answer.banner, /data as of 2026-12-06T11:59:00.000Z/);
  assert.equal(answer.error.kind, "overloaded");
  assert.equal(calls.length, 1 + DEFAULTS.maxAttempts, "three attempts, no more");
  assert.equal(clock.slept.length, 2);
  assert.ok(clock.slept.every((ms) => ms >= 2000 && ms <= 3000), `waited ${clock.slept}`);
  assert.equal(api.stats.retries, 2);
  assert.equal(api.stats.lastGood, 1);
});

test("while a call waits to retry, onStale gets the kept quote at once, once", async () => {
  const { fetch, calls } = scripted(
    json(200, QUOTE),
    error(429, "rate_limited", { "retry-after": "2" }),
    json(200, QUOTE),
  );
  const api = client(fetch, { random: () => 0.999 });
  await api.getRebate("taobao", "100001");
  const stale = [];
  const answer = await api.getRebate("taobao", "100001", {
    onStale: (kept) => stale.push({ kept, at: api.clock.now(), slept: api.clock.slept.length }),
  });
  assert.equal(stale.length, 1);
  assert.equal(stale[0].kept.source, "last_good");
  assert.match(stale[0].kept.banner, /data as of/);
  assert.equal(stale[0].slept, 0, "shown before the wait, not after it");
  assert.equal(answer.source, "network", "the retry's live answer follows");
  assert.equal(calls.length, 3);
  // Nothing kept: nothing to show early.
  const fresh = client(scripted(error(429, "rate_limited", { "retry-after": "1" }), json(200, QUOTE)).fetch, {
    random: () => 0.999,
  });
  let called = false;
  await fresh.getRebate("jd", "1", { onStale: () => (called = true) });
  assert.equal(called, false);
});

test("429 with an HTTP-date Retry-After past the budget falls back at once", async () => {
  const clock = fakeClock();
  const later = new Date(clock.now() + 60000).toUTCString();
  const { fetch, calls } = scripted(json(200, QUOTE), error(429, "rate_limited", { "retry-after": later }));
  const api = client(fetch, { clock });
  await api.getRebate("jd", "100002");
  const answer = await api.getRebate("jd", "100002");
  assert.equal(answer.source, "last_good");
  assert.equal(calls.length, 2, "a minute's Retry-After is not waited for within a 10 s budget");
  assert.deepEqual(clock.slept, []);
});

test("with nothing kept, an overloaded server's answer is an error saying so", async () => {
  const { fetch } = scripted(error(503, "overloaded", { "retry-after": "1" }));
  const api = client(fetch);
  await assert.rejects(api.getRebate("pdd", "100003"), (failure) => {
    assert.equal(failure.kind, "overloaded");
    assert.equal(failure.status, 503);
    assert.equal(failure.code, "overloaded");
    assert.equal(failure.retryAfterMs, 1000);
    return true;
  });
});

test("404, 400, 401 and 403 are never retried; a 500 is retried once", async () => {
  for (const [status, kind] of [
    [404, "not_found"],
    [400, "invalid"],
    [401, "unauthorized"],
    [403, "unauthorized"],
  ]) {
    const { fetch, calls } = scripted(error(status, "x"));
    await assert.rejects(client(fetch).getRebate("jd", "1"), (failure) => failure.kind === kind);
    assert.equal(calls.length, 1, `${status} is final`);
  }
  const { fetch, calls } = scripted(error(500, "internal"));
  await assert.rejects(client(fetch).getRebate("jd", "1"), (failure) => failure.status === 500);
  assert.equal(calls.length, 2, "one careful retry");
  // A 404 after a good answer is the answer: the item is gone, the kept quote is not shown.
  const gone = scripted(json(200, QUOTE), error(404, "item_not_found"));
  const api = client(gone.fetch);
  await api.getRebate("jd", "1");
  await assert.rejects(api.getRebate("jd", "1"), (failure) => failure.kind === "not_found");
  assert.equal(api.cache.size, 0, "a gone item's quote is dropped");
});

test("network errors back off and then fall back", async () => {
  const { fetch, calls } = scripted(json(200, QUOTE), new TypeError("fetch failed"));
  const api = client(fetch);
  await api.getRebate("jd", "9");
  const answer = await api.getRebate("jd", "9");
  assert.equal(answer.source, "last_good");
  assert.equal(answer.error.kind, "failed");
  assert.equal(calls.length, 1 + DEFAULTS.maxAttempts);
});

test("a new call for the same view cancels the one before, during its back-off", async () => {
  let release;
  const gate = new Promise((resolve) => {
    release = resolve;
  });
  const clock = fakeClock();
  clock.sleep = (ms, signal) =>
    new Promise((resolve, reject) => {
      clock.slept.push(ms);
      signal?.addEventListener("abort", () => reject(new RebateError("aborted", "cancelled")), {
        once: true,
      });
      gate.then(resolve);
    });
  const { fetch, calls } = scripted(error(503, "overloaded", { "retry-after": "1" }), json(200, QUOTE));
  // Draws near 1: the throttle (one refusal in its window) admits; its share is tested apart.
  const api = client(fetch, { clock, random: () => 0.999 });
  const first = api.getRebate("jd", "1", { view: "detail" });
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(calls.length, 1, "the first call is backing off");
  const second = api.getRebate("jd", "2", { view: "detail" });
  await assert.rejects(first, (failure) => failure.kind === "aborted");
  // The second call waits out the server's Retry-After too, then asks.
  assert.equal(calls.length, 1);
  release();
  const answer = await second;
  assert.equal(answer.source, "network");
  assert.equal(calls.length, 2, "the cancelled call sent nothing more");
  assert.equal(calls[1].url, "http://api.test/api/v1/items/jd/2/rebate");
});

test("an AbortSignal cancels a call", async () => {
  const { fetch } = scripted(json(200, QUOTE));
  const api = client(fetch);
  const controller = new AbortController();
  controller.abort("navigated away");
  await assert.rejects(api.getRebate("jd", "1", { signal: controller.signal }), (failure) => {
    return failure.kind === "aborted";
  });
});

test("a server that keeps refusing is refused locally, and a storm of retries does not form", async () => {
  const { fetch, calls } = scripted(error(429, "rate_limited", { "retry-after": "1" }));
  const api = client(fetch, { random: seeded(11) });
  // Thirty user actions (say, taps) a second for a minute while the limit holds.
  let failures = 0;
  for (let tap = 0; tap < 1800; tap += 1) {
    api.clock.nowMs += 33;
    await api.getRebate("jd", String(tap % 10)).catch(() => {
      failures += 1;
    });
  }
  assert.equal(failures, 1800, "nothing kept, nothing to show");
  assert.ok(api.stats.throttled > 0, "some attempts were refused locally");
  assert.ok(
    calls.length < 1800 * 0.5,
    `${calls.length} requests reached the server for ${1800 * DEFAULTS.maxAttempts} attempts`,
  );
});

test("a part served stale shows the banner with its as_of; a template part does not", async () => {
  const stale = {
    ...QUOTE,
    degraded: true,
    degraded_parts: [{ part: "coupons", reason: "timeout", served: "stale", as_of: "2026-12-06T11:50:00Z" }],
  };
  const template = {
    ...QUOTE,
    degraded: true,
    degraded_parts: [{ part: "extras", reason: "shed", served: "template", as_of: null }],
  };
  const { fetch } = scripted(json(200, stale), json(200, template));
  const api = client(fetch);
  const first = await api.getRebate("jd", "1");
  assert.equal(first.asOf, Date.parse("2026-12-06T11:50:00Z"));
  assert.match(first.banner, /2026-12-06T11:50:00.000Z/);
  const second = await api.getRebate("jd", "2");
  assert.equal(second.banner, null);
});

test("the kept quotes are bounded, least recently used first out", async () => {
  const { fetch } = scripted(json(200, QUOTE, { etag: '"x"' }));
  const api = client(fetch, { cacheEntries: 3 });
  for (const item of ["1", "2", "3", "4"]) await api.getRebate("jd", item);
  assert.equal(api.cache.size, 3);
  assert.ok(![...api.cache.keys()].some((url) => url.endsWith("/jd/1/rebate")));
});

test("a Retry-After holds for every call: within it nothing is sent", async () => {
  const { fetch, calls } = scripted(
    json(200, QUOTE),
    error(429, "rate_limited", { "retry-after": "5" }),
    json(200, QUOTE),
  );
  const api = client(fetch, { budgetMs: 2000, random: () => 0.999 });
  await api.getRebate("jd", "1");
  // The 429's 5 s do not fit a 2 s budget: the kept quote at once.
  const limited = await api.getRebate("jd", "1");
  assert.equal(limited.source, "last_good");
  assert.equal(calls.length, 2);
  // Another item within the 5 s: nothing sent, nothing kept for it.
  api.clock.nowMs += 1000;
  await assert.rejects(api.getRebate("jd", "2"), (failure) => failure.kind === "overloaded");
  assert.equal(calls.length, 2, "no request inside the server's Retry-After");
  // After it, requests go out again.
  api.clock.nowMs += 5000;
  const answer = await api.getRebate("jd", "2");
  assert.equal(answer.source, "network");
  assert.equal(calls.length, 3);
});
