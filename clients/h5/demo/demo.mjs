// The demo page: one item's rebate through the reference client. It shows the quote, its
// coupons and notices, the "data as of" banner when the answer is not live, and the client's
// counts (requests, retries, local refusals, last good answers shown).
import { RebateClient } from "../rebate-client.mjs";

const params = new URLSearchParams(location.search);
const api = params.get("api") ?? location.origin;
// One id per install, kept across visits.
const clientId =
  localStorage.getItem("rebateClientId") ??
  (() => {
    const id = `h5-${crypto.randomUUID()}`;
    localStorage.setItem("rebateClientId", id);
    return id;
  })();
// `?seed=N` makes the client's draws (back-off, jitter, local refusals) repeatable, for tests.
const seed = params.get("seed");
const client = new RebateClient({
  baseUrl: api,
  clientId,
  random: seed === null ? Math.random : seeded(Number(seed)),
});
window.rebateClient = client;

const $ = (id) => document.getElementById(id);
const yuan = (cents) => (cents === null || cents === undefined ? "—" : `¥${(cents / 100).toFixed(2)}`);

function showStats() {
  const { requests, retries, throttled, lastGood } = client.stats;
  $("stats").textContent =
    `requests ${requests} · retries ${retries} · refused locally ${throttled} · last good shown ${lastGood}`;
}

function render(answer) {
  const { quote } = answer;
  $("error").hidden = true;
  $("quote").hidden = false;
  $("title").textContent = quote.item.title;
  $("shop").textContent = quote.item.shop_name ?? "";
  $("price").textContent = yuan(quote.item.price_cents);
  $("rebate").textContent = yuan(quote.rebate.estimated_cents);
  $("rate").textContent = quote.rebate.rate_bps === null ? "" : `(${quote.rebate.rate_bps / 100}%)`;
  $("coupons").replaceChildren(
    ...quote.coupons.map((coupon) => {
      const item = document.createElement("li");
      item.textContent = `满 ${yuan(coupon.threshold_cents)} 减 ${yuan(coupon.discount_cents)}`;
      return item;
    }),
  );
  $("notices").replaceChildren(
    ...quote.notices.map((notice) => {
      const item = document.createElement("li");
      item.textContent = notice;
      return item;
    }),
  );
  $("banner").hidden = answer.banner === null;
  $("banner").textContent = answer.banner ?? "";
  $("trace").textContent = answer.traceId;
  $("source").textContent = answer.source;
  document.body.dataset.source = answer.source;
}

async function load() {
  const platform = $("platform").value;
  const item = $("item").value.trim();
  document.body.dataset.state = "loading";
  try {
    // While the call waits to retry, the kept quote shows at once, with its banner.
    render(await client.getRebate(platform, item, { view: "detail", onStale: render }));
    document.body.dataset.state = "shown";
  } catch (error) {
    if (error.kind === "aborted") return;
    $("quote").hidden = true;
    $("banner").hidden = true;
    $("error").hidden = false;
    $("error").textContent =
      error.kind === "not_found" ? "商品不存在 item not found" : `暂时无法获取 (${error.kind}) · busy, try again`;
    $("trace").textContent = error.traceId;
    document.body.dataset.state = `error:${error.kind}`;
  } finally {
    showStats();
  }
}

$("query").addEventListener("submit", (event) => {
  event.preventDefault();
  load();
});
if (params.get("platform")) $("platform").value = params.get("platform");
if (params.get("item")) $("item").value = params.get("item");
load();

/** mulberry32: a small seeded generator. */
function seeded(start) {
  let state = start >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
