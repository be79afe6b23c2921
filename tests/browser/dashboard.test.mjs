// The operator dashboard, end to end in headless Chromium: scripts/dashboard-test.sh starts the
// service, provokes a slow request and runs this with
//
//   DASHBOARD_URL   the admin listener's base URL (http://127.0.0.1:PORT)
//   ADMIN_TOKEN     its token
//   TRACE_ID        the slow request's trace id (from its x-trace-id header)
//   OUT_DIR         where the screenshot goes
//   CHROMIUM_BIN    the browser (default /usr/bin/chromium)
//
// It opens the page, is refused with a wrong token and asked again, enters the right one, waits
// for the slow request to be listed, opens it and checks its stages are shown. Then the live
// rules: with a first version stored through the API, the Rules panel shows it and puts its
// document in the editor; the test edits the coupon quota there, a dry run of 50 (above the
// ceiling of 45) shows the refusal's field, a dry run of 30 shows the diff line 45 → 30 and stores
// nothing, Apply (enabled only for the text dry-run) stores a new version, and the page reports it
// applied once every instance runs it, as GET /admin/v1/rules says. Last it saves a full-page
// screenshot that it decodes and checks is not blank (many colours, none covering the page), the
// check itself first held to a blank page's screenshot. Every wait is bounded; the page's own
// errors (a script error, a Content-Security-Policy violation) fail the test too.

import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { inflateSync } from 'node:zlib';
import { chromium } from 'playwright-core';

const STEP_TIMEOUT_MS = 20_000;
const WHOLE_TEST_MS = 120_000;

function required(name) {
  const value = process.env[name];
  if (!value) {
    console.error(`dashboard test: ${name} is not set (run scripts/dashboard-test.sh)`);
    process.exit(2);
  }
  return value;
}

const base = required('DASHBOARD_URL');
const token = required('ADMIN_TOKEN');
const traceId = required('TRACE_ID');
const outDir = required('OUT_DIR');
const executablePath = process.env.CHROMIUM_BIN || '/usr/bin/chromium';

/** Decodes an 8-bit RGB or RGBA PNG (what Chromium's screenshots are) into its pixels. */
export function decodePng(buffer) {
  const signature = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  assert.ok(buffer.subarray(0, 8).equals(signature), 'the screenshot is a PNG');
  let offset = 8;
  let header = null;
  const data = [];
  while (offset < buffer.length) {
    const length = buffer.readUInt32BE(offset);
    const type = buffer.toString('latin1', offset + 4, offset + 8);
    const body = buffer.subarray(offset + 8, offset + 8 + length);
    if (type === 'IHDR') {
      header = {
        width: body.readUInt32BE(0),
        height: body.readUInt32BE(4),
        bitDepth: body[8],
        colorType: body[9],
        interlace: body[12],
      };
    } else if (type === 'IDAT') {
      data.push(body);
    } else if (type === 'IEND') {
      break;
    }
    offset += 12 + length;
  }
  assert.ok(header, 'the PNG has a header');
  assert.equal(header.bitDepth, 8, 'an 8-bit PNG');
  assert.equal(header.interlace, 0, 'a non-interlaced PNG');
  const channels = { 2: 3, 6: 4 }[header.colorType];
  assert.ok(channels, `an RGB or RGBA PNG (colour type ${header.colorType})`);
  const raw = inflateSync(Buffer.concat(data));
  const stride = header.width * channels;
  assert.equal(raw.length, (stride + 1) * header.height, 'the image data has every row');
  const pixels = Buffer.alloc(stride * header.height);
  for (let y = 0; y < header.height; y += 1) {
    const filter = raw[y * (stride + 1)];
    const row = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    const out = pixels.subarray(y * stride, (y + 1) * stride);
    const previous = y > 0 ? pixels.subarray((y - 1) * stride, y * stride) : null;
    for (let x = 0; x < stride; x += 1) {
      const left = x >= channels ? out[x - channels] : 0;
      const up = previous ? previous[x] : 0;
      const upLeft = previous && x >= channels ? previous[x - channels] : 0;
      let predictor;
      switch (filter) {
        case 0: predictor = 0; break;
        case 1: predictor = left; break;
        case 2: predictor = up; break;
        case 3: predictor = (left + up) >> 1; break;
        case 4: {
          const estimate = left + up - upLeft;
          const toLeft = Math.abs(estimate - left);
          const toUp = Math.abs(estimate - up);
          const toUpLeft = Math.abs(estimate - upLeft);
          predictor = toLeft <= toUp && toLeft <= toUpLeft ? left : toUp <= toUpLeft ? up : upLeft;
          break;
        }
        default: throw new Error(`PNG row ${y} has an unknown filter ${filter}`);
      }
      out[x] = (row[x] + predictor) & 0xff;
    }
  }
  return { width: header.width, height: header.height, channels, pixels };
}

/** How many distinct colours an image has, and the share of its commonest one. */
export function colourSpread({ width, height, channels, pixels }) {
  const counts = new Map();
  for (let index = 0; index < width * height; index += 1) {
    const at = index * channels;
    const colour = (pixels[at] << 16) | (pixels[at + 1] << 8) | pixels[at + 2];
    counts.set(colour, (counts.get(colour) || 0) + 1);
  }
  const commonest = Math.max(...counts.values());
  return { distinct: counts.size, commonestShare: commonest / (width * height) };
}

/** The admin API, as the test itself (not the page) sees it. */
async function admin(path, body) {
  const response = await fetch(base + path, {
    method: body === undefined ? 'GET' : 'POST',
    headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const answer = await response.json();
  assert.ok(response.ok, `${path}: ${response.status} ${JSON.stringify(answer)}`);
  return answer;
}

/** Polls `condition` every 50 ms for at most STEP_TIMEOUT_MS. */
async function until(condition, what) {
  const deadline = Date.now() + STEP_TIMEOUT_MS;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`not within ${STEP_TIMEOUT_MS} ms: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

async function main() {
  mkdirSync(outDir, { recursive: true });
  const browser = await chromium.launch({
    executablePath,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
    timeout: STEP_TIMEOUT_MS,
  });
  try {
    const context = await browser.newContext({ viewport: { width: 1440, height: 1000 } });
    const page = await context.newPage();
    page.setDefaultTimeout(STEP_TIMEOUT_MS);
    // The page's own errors. The browser also logs every answer of 4xx as a console error: the
    // admin listener has no /favicon.ico, and the refusals this test provokes on purpose (a
    // wrong token, a trace id never recorded) are expected; anything else is a problem.
    const problems = [];
    let expectRefusals = false;
    // The dry run of a value above its ceiling is answered 400 on purpose.
    let expectRuleRefusal = false;
    const unknownTraceId = '0123456789abcdef0123456789abcdef';
    page.on('pageerror', (error) => problems.push(`script error: ${error.message}`));
    page.on('console', (message) => {
      if (message.type() !== 'error') return;
      const url = message.location().url || '';
      const expected = url.endsWith('/favicon.ico') || url.endsWith(`/slow-requests/${unknownTraceId}`) ||
        (expectRefusals && / 401 /.test(message.text())) ||
        (expectRuleRefusal && url.endsWith('/admin/v1/rules?dry_run=true') && / 400 /.test(message.text()));
      if (!expected) problems.push(`console error: ${message.text()} (${url})`);
    });
    let refused = 0;
    page.on('response', (answer) => {
      if (answer.status() === 401) refused += 1;
    });
    const apiCalls = [];
    page.on('request', (request) => {
      if (request.url().includes('/admin/v1/')) apiCalls.push(request);
    });

    // The check of the screenshot below, held to a blank page first: if the decoder were wrong,
    // a blank page would not read as one colour.
    const blank = colourSpread(decodePng(await page.screenshot({ fullPage: true })));
    assert.equal(blank.distinct, 1, `a blank page reads as ${blank.distinct} colours`);

    const response = await page.goto(`${base}/dashboard`);
    assert.equal(response.status(), 200, 'GET /dashboard');
    await page.locator('#token').waitFor({ state: 'visible' });
    assert.equal(await page.locator('#board').isHidden(), true, 'no data before a token');

    // A wrong token is refused (401) and asked for again.
    expectRefusals = true;
    await page.fill('#token', 'not-the-token');
    await page.click('#token-form button[type=submit]');
    await page.waitForFunction(
      () => document.getElementById('login-message').textContent.includes('401'),
      null,
      { timeout: STEP_TIMEOUT_MS },
    );
    assert.equal(await page.locator('#board').isHidden(), true, 'a refused token shows no data');
    // Every refused call (status, slow requests, the rules and their history) is answered, and
    // their console lines logged, before refusals count as problems again.
    await until(() => refused >= 4, 'the four calls with the wrong token answered 401');
    await page.waitForTimeout(250);
    expectRefusals = false;

    await page.fill('#token', token);
    await page.click('#token-form button[type=submit]');
    const row = page.locator(`#slow-requests tr[data-trace-id="${traceId}"]`);
    await row.waitFor({ state: 'visible', timeout: STEP_TIMEOUT_MS });
    console.log(`dashboard test: the slow request ${traceId} is listed`);

    // The token was used as a bearer token and kept nowhere that outlives the page.
    const lastCall = apiCalls[apiCalls.length - 1];
    assert.equal((await lastCall.allHeaders()).authorization, `Bearer ${token}`);
    const kept = await page.evaluate(() => ({
      local: localStorage.length,
      session: sessionStorage.length,
      cookie: document.cookie,
      href: location.href,
      input: document.getElementById('token').value,
    }));
    assert.deepEqual(
      { ...kept, href: kept.href.includes(token) },
      { local: 0, session: 0, cookie: '', href: false, input: '' },
      'the token is in no storage, cookie, URL or form field',
    );

    // The status figures the issue names are on the page.
    for (const dependency of ['mysql', 'redis', 'coupons', 'extras']) {
      await page
        .locator('#dependencies tbody tr', { hasText: dependency })
        .first()
        .waitFor({ state: 'visible' });
    }
    for (const part of ['product', 'rate', 'coupons', 'extras']) {
      await page.locator('#caches tbody tr', { hasText: part }).first().waitFor({ state: 'visible' });
    }
    const shedding = await page.locator('#shedding').innerText();
    assert.match(shedding, /Level/);
    assert.match(shedding, /Load/);
    assert.match(await page.locator('#events').innerText(), /Processed/);
    assert.match(await page.locator('#consistency').innerText(), /Observer/);
    assert.match(await page.locator('#caches').innerText(), /\d+\.\d %/, 'a hit ratio is shown');

    // Opening it shows its stages, the slow coupon call among them.
    await row.locator('button.link').click();
    const stages = page.locator('#detail-stages tbody tr');
    await stages.first().waitFor({ state: 'visible' });
    assert.equal((await page.locator('#detail-trace-id').textContent()).trim(), traceId);
    const breakdown = await page.locator('#detail').innerText();
    assert.match(breakdown, /coupons/, 'the coupon stage is in the breakdown');
    assert.ok((await stages.count()) >= 1);
    assert.equal(await row.getAttribute('class'), 'selected', 'the opened row is marked');

    // A trace id typed in is looked up too (this one was never recorded).
    await page.fill('#trace-id', unknownTraceId);
    await page.click('#trace-form button[type=submit]');
    await page.waitForFunction(
      () => document.getElementById('detail-message').textContent.includes('no record'),
    );
    await row.locator('button.link').click();
    await page.waitForFunction(
      (id) => document.getElementById('detail-trace-id').textContent === id &&
        document.querySelectorAll('#detail-stages tbody tr').length > 0,
      traceId,
    );

    await checkRules(page, (expect) => {
      expectRuleRefusal = expect;
    });

    // Let one more refresh run with the detail open: it must not break anything.
    await page.waitForTimeout(3500);
    assert.deepEqual(problems, [], 'the page raised no error');

    const screenshot = join(outDir, 'dashboard.png');
    const png = await page.screenshot({ path: screenshot, fullPage: true });
    const image = decodePng(png);
    const spread = colourSpread(image);
    writeFileSync(join(outDir, 'dashboard.json'), JSON.stringify({ traceId, ...spread, width: image.width, height: image.height }, null, 2));
    assert.ok(image.width >= 1000 && image.height >= 900, `a full page (${image.width}×${image.height})`);
    assert.ok(spread.distinct >= 64, `the screenshot has ${spread.distinct} colours: a blank page has one or two`);
    assert.ok(spread.commonestShare < 0.95, `one colour covers ${(spread.commonestShare * 100).toFixed(1)} % of it`);
    console.log(
      `dashboard test: screenshot ${screenshot} (${image.width}×${image.height}, ${spread.distinct} colours, ` +
        `commonest ${(spread.commonestShare * 100).toFixed(1)} %)`,
    );
  } catch (error) {
    // What the page showed when it failed, for whoever reads the CI log.
    const pages = browser.contexts().flatMap((context) => context.pages());
    if (pages.length > 0) {
      const failure = join(outDir, 'failure.png');
      await pages[0].screenshot({ path: failure, fullPage: true }).catch(() => {});
      console.error(`dashboard test: the page at the failure is ${failure}`);
    }
    throw error;
  } finally {
    await browser.close();
  }
}

/**
 * The Rules panel: shows a stored version and puts its document in the editor; a dry run shows a
 * refusal's field or the diff and stores nothing; Apply stores the dry-run text as a new version,
 * which the page reports applied once GET /admin/v1/rules has every instance on it.
 */
async function checkRules(page, expectRuleRefusal) {
  const QUOTA = 'resilience.coupons.quota_per_sec';
  // A first version, so the editor has a document to start from (a key the edit leaves alone).
  const first = await admin('/admin/v1/rules', {
    document: { warm_jobs: { rate_per_sec: 150 } },
    author: 'dashboard-test',
    reason: 'a first version to edit',
  });
  const overview = await admin('/admin/v1/rules');
  const self = overview.this_instance.instance_id;
  const instanceRow = page.locator(`#rules-instances tr[data-instance="${self}"]`);
  await instanceRow.waitFor({ state: 'visible' });
  await page.waitForFunction(
    (version) => document.getElementById('rules-active').textContent.includes(`Version${version}Active since`) &&
      document.getElementById('rules-editor').value.includes('"rate_per_sec": 150'),
    first.version,
  );
  assert.match(await page.locator('#rules-document').innerText(), /"rate_per_sec": 150/);
  assert.equal(await page.locator('#rules-apply').isDisabled(), true, 'no Apply before a dry run');

  const edit = async (quota) => {
    const documentValue = JSON.parse(await page.inputValue('#rules-editor'));
    documentValue.resilience = { coupons: { quota_per_sec: quota } };
    await page.fill('#rules-editor', JSON.stringify(documentValue, null, 2));
  };
  await page.fill('#rules-author', 'dashboard-test');
  await page.fill('#rules-reason', 'the coupon provider asked for less');

  // Above the ceiling: the 400's field is shown, and Apply stays off.
  expectRuleRefusal(true);
  await edit(50);
  await page.click('#rules-dry-run');
  await page.locator('#rules-field').waitFor({ state: 'visible' });
  assert.equal(await page.locator('#rules-field').textContent(), QUOTA);
  assert.match(await page.locator('#rules-outcome').innerText(), /400 invalid_rule.*ceiling/s);
  assert.equal(await page.locator('#rules-apply').isDisabled(), true, 'no Apply after a refusal');
  await page.waitForTimeout(250);
  expectRuleRefusal(false);
  console.log(`dashboard test: a quota of 50 is refused, naming ${QUOTA}`);

  // 30: the dry run's diff is the one line 45 → 30, and nothing is stored.
  await edit(30);
  await page.click('#rules-dry-run');
  const line = page.locator(`#rules-dry-run-diff li[data-key="${QUOTA}"]`);
  await line.waitFor({ state: 'visible' });
  assert.equal(await line.textContent(), `${QUOTA}: 45 → 30`);
  assert.equal(await page.locator('#rules-dry-run-diff li').count(), 1, 'only the quota changes');
  assert.equal((await admin('/admin/v1/rules')).active.version, first.version, 'a dry run stores nothing');
  assert.equal(await page.locator('#rules-apply').isEnabled(), true, 'Apply after a dry run');

  // An edit after the dry run takes Apply away until the text is dry-run again.
  await page.fill('#rules-reason', 'the coupon provider asked for less (30/s)');
  assert.equal(await page.locator('#rules-apply').isDisabled(), true, 'no Apply for text not dry-run');
  await page.click('#rules-dry-run');
  await line.waitFor({ state: 'visible' });
  await page.waitForFunction(() => !document.getElementById('rules-apply').disabled);

  await page.click('#rules-apply');
  const applied = page.locator('#rules-applied');
  await applied.waitFor({ state: 'visible' });
  const version = Number(await applied.getAttribute('data-version'));
  assert.ok(version > first.version, `a new version (${version})`);
  const after = await admin('/admin/v1/rules');
  assert.equal(after.active.version, version, 'the new version is active');
  assert.equal(after.this_instance.applied_version, version, 'this instance runs it');
  assert.equal(after.effective.resilience.coupons.quota_per_sec, 30);
  assert.ok(after.instances.every((instance) => instance.applied_version === version), 'every instance runs it');
  // The page says so in the instance's row and the active version, and the history has the diff.
  await page.waitForFunction(
    ([id, expected]) => {
      const row = document.querySelector(`#rules-instances tr[data-instance="${id}"]`);
      return row && row.cells[1].textContent === String(expected) &&
        document.getElementById('rules-active').textContent.includes(`Version${expected}Active since`);
    },
    [self, version],
  );
  const history = await page.locator('#rules-history').innerText();
  // Against the version before's document, which left the quota to the config file.
  assert.ok(history.includes(`${QUOTA}: (config file) → 30`), `the history shows the diff: ${history}`);
  assert.match(history, /the coupon provider asked for less \(30\/s\)/);
  console.log(`dashboard test: version ${version} (quota 45 → 30) applied on every instance, as the page shows`);
}

const watchdog = setTimeout(() => {
  console.error(`dashboard test: not finished after ${WHOLE_TEST_MS / 1000} s`);
  process.exit(1);
}, WHOLE_TEST_MS);

try {
  await main();
  clearTimeout(watchdog);
} catch (error) {
  clearTimeout(watchdog);
  console.error(`dashboard test FAILED: ${error.stack || error}`);
  process.exitCode = 1;
}

