// The H5 demo page (clients/h5/demo) with the reference client, end to end in headless Chromium
// against the real service: scripts/demo-test.sh starts the service (its CORS list holding the
// page's origin, cache-only serving strict) and a static server for the page, and runs this with
//
//   PAGE_URL      the demo page, its `api`, `platform` and `item` in the query string
//   API_URL       the API's base URL (the requests counted are the ones sent there)
//   ADMIN_URL     the admin listener's base URL
//   ADMIN_TOKEN   its token
//   OUT_DIR       where the screenshots go
//   CHROMIUM_BIN  the browser (default /usr/bin/chromium)
//
// 1. A normal answer: the quote, no banner.
// 2. The shed level pinned to cache_only and the item's product and rate fenced by events
//    (nothing cached to answer it from): the server answers 503 with Retry-After; the page shows the last good answer with
//    the "data as of" banner, after at most the contract's 3 requests.
// 3. The pin released: the banner goes with the next answer (after the Retry-After, one retry).
// 4. A per-client limit of 0.05/s (a live rule): once its one token is spent, 429 with a
//    Retry-After of about 20 s, longer than the call's budget: the last good answer at once,
//    one request.
// Every wait is bounded; the page's own errors fail the test.

import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const STEP_TIMEOUT_MS = 30_000;

function required(name) {
  const value = process.env[name];
  if (!value) {
    console.error(`demo test: ${name} is not set (run scripts/demo-test.sh)`);
    process.exit(2);
  }
  return value;
}

const pageUrl = required('PAGE_URL');
const apiUrl = required('API_URL');
const adminUrl = required('ADMIN_URL');
const token = required('ADMIN_TOKEN');
const outDir = required('OUT_DIR');
const executablePath = process.env.CHROMIUM_BIN || '/usr/bin/chromium';
const params = new URL(pageUrl).searchParams;
const platform = params.get('platform');
const item = params.get('item');

async function admin(method, path, body) {
  const response = await fetch(`${adminUrl}${path}`, {
    method,
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  assert.ok(response.ok, `${method} ${path}: ${response.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

mkdirSync(outDir, { recursive: true });
const browser = await chromium.launch({
  executablePath,
  args: [
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
});
const failures = [];
try {
  const page = await browser.newPage({ viewport: { width: 480, height: 900 } });
  page.on('pageerror', (error) => failures.push(`page error: ${error.message}`));
  // The API's GETs (preflights apart): what the contract bounds.
  const sent = [];
  page.on('request', (request) => {
    if (request.url().startsWith(apiUrl) && request.method() === 'GET') sent.push(request.url());
  });
  // Waits until the page shows an answer from one of `sources` (a name or a list).
  const shown = async (sources) => {
    const source = [sources].flat();
    try {
      await page.waitForFunction(
        (wanted) =>
          document.body.dataset.state === 'shown' && wanted.includes(document.body.dataset.source),
        source,
        { timeout: STEP_TIMEOUT_MS },
      );
    } catch (error) {
      const seen = await page.evaluate(() => ({
        state: document.body.dataset.state,
        source: document.body.dataset.source,
        error: document.getElementById('error').textContent,
        stats: document.getElementById('stats').textContent,
      }));
      await page.screenshot({ path: join(outDir, 'failed.png'), fullPage: true });
      throw new Error(`waiting for ${source}: the page shows ${JSON.stringify(seen)}`, {
        cause: error,
      });
    }
  };
  const load = async () => {
    await page.evaluate(() => {
      document.body.dataset.state = 'loading';
      document.body.dataset.source = '';
    });
    await page.click('#load');
  };

  // 1. Normal, five times (the later ones revalidated: 304). Five accepted requests keep the
  //    client's adaptive throttle from refusing anything locally after the three refusals below
  //    (requests − 2 × accepts stays below 0), so every count here is exact; the throttle itself
  //    is tested in clients/h5/test.
  await page.goto(pageUrl);
  await shown('network');
  assert.equal(await page.isHidden('#banner'), true, 'no banner on a live answer');
  assert.notEqual(await page.textContent('#title'), '');
  for (let again = 0; again < 4; again += 1) {
    await load();
    await shown('revalidated');
  }
  assert.equal(sent.length, 5);
  await page.screenshot({ path: join(outDir, '1-normal.png'), fullPage: true });

  // 2. Cache only, and nothing cached for the item: 503 with Retry-After.
  await admin('PUT', '/admin/v1/shedding', { level: 'cache_only' });
  // Both store-backed parts fenced a version ahead: at cache_only the item has nothing to be
  // answered from (the product gone, nothing is shown).
  const inspection = await admin('GET', `/admin/v1/items/${platform}/${item}`);
  for (const [kind, part] of [
    ['product_changed', 'product'],
    ['rate_changed', 'rate'],
  ]) {
    await admin('POST', '/admin/v1/events', {
      kind,
      platform,
      item_ids: [item],
      version: inspection.store[part].version + 1,
    });
  }
  const before503 = sent.length;
  await load();
  await shown('last_good');
  assert.equal(await page.isVisible('#banner'), true, 'the banner shows the last good answer');
  assert.match(await page.textContent('#banner'), /data as of/);
  const during503 = sent.length - before503;
  assert.ok(during503 >= 1 && during503 <= 3, `${during503} requests: at most the contract's 3`);
  await page.screenshot({ path: join(outDir, '2-cache-only-503.png'), fullPage: true });

  // 3. The pin released: the next answer is live again (after the Retry-After: one retry).
  await admin('PUT', '/admin/v1/shedding', { level: null });
  const beforeRelease = sent.length;
  await load();
  await shown(['network', 'revalidated']);
  assert.equal(await page.isHidden('#banner'), true, 'the banner goes with a live answer');
  assert.equal(sent.length - beforeRelease, 1, 'one request once the Retry-After passed');
  await page.screenshot({ path: join(outDir, '3-released.png'), fullPage: true });

  // 4. The per-client limit exhausted: 429 with a Retry-After past the call's budget.
  await admin('POST', '/admin/v1/rules', {
    author: 'demo-test',
    reason: 'a per-client limit to exhaust',
    document: { resilience: { client_limit: { per_sec: 0.05, burst: 1 } } },
  });
  await new Promise((resolve) => setTimeout(resolve, 500));
  // The one token goes on this load (a live answer), the next load meets the 429.
  await load();
  await shown(['network', 'revalidated']);
  const before429 = sent.length;
  await load();
  await shown('last_good');
  assert.equal(await page.isVisible('#banner'), true);
  assert.equal(sent.length - before429, 1, 'a Retry-After past the budget: no retry');
  // Within that Retry-After the client sends nothing at all.
  await load();
  await shown('last_good');
  assert.equal(sent.length - before429, 1, 'nothing sent inside the Retry-After');
  const stats = await page.textContent('#stats');
  await page.screenshot({ path: join(outDir, '4-client-limit-429.png'), fullPage: true });
  console.log(`[demo-test] ${sent.length} requests in all; ${stats}`);
} finally {
  await browser.close();
}
assert.deepEqual(failures, [], 'the page raised no error');
console.log('[demo-test] passed');
