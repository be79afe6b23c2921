// The operator dashboard's script (served by services/query-api/src/http/dashboard.rs, whose
// module documentation is the contract). Every figure is fetched from the admin listener's
// /admin/v1 JSON routes with the bearer token the operator enters once; `token` below is the only
// copy of it (no storage, no cookie, no URL), so reloading or closing the tab forgets it, and a
// 401 asks for it again. Data only ever becomes text nodes, never markup: a trace id, a path or
// an error message from the server cannot inject anything into the page.
//
// Panels of their own (rules.js, loaded after this file) plug in through `window.rebateDashboard`:
// they get the helpers below (`api` uses the token without handing it out) and refresh, clear and
// ask for the token with the board.
'use strict';

(() => {
  /** How often the figures are fetched again. */
  const REFRESH_MS = 3000;
  const TRACE_ID = /^[0-9a-f]{32}$/;
  const LEVELS = ['normal', 'drop_extras', 'short_timeouts', 'cache_only'];

  /** The admin token: in this variable and nowhere else. */
  let token = null;
  /** Bumped whenever the token changes: answers to an older token's requests are dropped. */
  let generation = 0;
  let timer = null;
  let paused = false;
  /** The trace id whose stages are shown, to mark its row. */
  let selected = null;

  class Unauthorized extends Error {}

  const byId = (id) => {
    const node = document.getElementById(id);
    if (!node) throw new Error('the page has no #' + id);
    return node;
  };

  /** An element with text (or element) children; strings always become text nodes. */
  function el(tag, className, ...children) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // ----- formatting -------------------------------------------------------------------------

  const isNumber = (value) => typeof value === 'number' && Number.isFinite(value);

  function num(value, digits = 0) {
    if (!isNumber(value)) return '—';
    return value.toLocaleString('en-US', { maximumFractionDigits: digits });
  }

  const ms = (value) => (isNumber(value) ? num(value, value < 10 ? 2 : 1) + ' ms' : '—');
  const rps = (value) => (isNumber(value) ? num(value, 1) + '/s' : '—');
  const pct = (value) => (isNumber(value) ? (value * 100).toFixed(1) + ' %' : '—');

  /** hits / (hits + misses), or null when nothing was looked up (the tier may not exist). */
  function hitRatio(hits, misses) {
    const total = (hits || 0) + (misses || 0);
    return total > 0 ? hits / total : null;
  }

  function bytes(value) {
    if (!isNumber(value)) return '—';
    const units = ['B', 'KiB', 'MiB', 'GiB'];
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    return num(value, unit === 0 ? 0 : 1) + ' ' + units[unit];
  }

  function duration(millis) {
    if (!isNumber(millis)) return '—';
    if (millis < 1000) return num(millis) + ' ms';
    const seconds = millis / 1000;
    if (seconds < 120) return num(seconds, 1) + ' s';
    const minutes = seconds / 60;
    if (minutes < 120) return num(minutes, 1) + ' min';
    return num(minutes / 60, 1) + ' h';
  }

  const badge = (text, tone) => el('span', 'badge ' + tone, text);

  function levelBadge(level) {
    const index = LEVELS.indexOf(level);
    const tone = index <= 0 ? 'ok' : index === 1 ? 'warn' : 'bad';
    return badge(index >= 0 ? index + ' · ' + level : String(level), tone);
  }

  function breakerBadge(state) {
    const tone = state === 'closed' ? 'ok' : state === 'half_open' ? 'warn' : 'bad';
    return badge(String(state).replace('_', '-'), tone);
  }

  /** A meter of `value` out of `max` (the bar is drawn through the CSSOM, which the policy allows). */
  function meter(value, max, tone) {
    const track = el('span', 'meter');
    const fill = el('span', 'fill ' + (tone || ''));
    const share = isNumber(value) && isNumber(max) && max > 0 ? Math.min(value / max, 1) : 0;
    fill.style.width = (share * 100).toFixed(1) + '%';
    track.append(fill);
    return track;
  }

  // ----- building blocks --------------------------------------------------------------------

  /** Replaces a <dl>'s content with `[term, value]` pairs (a value may be a node or a list). */
  function facts(list, pairs) {
    list.replaceChildren(
      ...pairs
        .filter((pair) => pair)
        .flatMap(([term, value]) => [el('dt', null, term), el('dd', null, value)]),
    );
  }

  /**
   * A table of `rows`; each row is `{cells, traceId?, className?}` or a list of cells, and each
   * cell text or nodes.
   */
  function table(headers, rows, className) {
    const head = el('thead', null, el('tr', null, headers.map((header) => el('th', null, header))));
    const body = el(
      'tbody',
      null,
      rows.map((row) => {
        const cells = Array.isArray(row) ? row : row.cells;
        const tr = el('tr', Array.isArray(row) ? null : row.className, cells.map((cell) => el('td', null, cell)));
        if (!Array.isArray(row) && row.traceId) tr.dataset.traceId = row.traceId;
        return tr;
      }),
    );
    return el('table', className || null, head, body);
  }

  function emptyNote(text) {
    return el('p', 'muted', text);
  }

  // ----- talking to /admin/v1 ---------------------------------------------------------------

  /** GETs `path`, or sends `payload` as JSON with `method`; resolves to the answer's JSON. */
  async function api(path, method = 'GET', payload = undefined) {
    const headers = { Authorization: 'Bearer ' + token, Accept: 'application/json' };
    if (payload !== undefined) headers['Content-Type'] = 'application/json';
    const response = await fetch(path, {
      method,
      headers,
      body: payload === undefined ? undefined : JSON.stringify(payload),
      cache: 'no-store',
      credentials: 'omit',
      redirect: 'error',
      referrerPolicy: 'no-referrer',
    });
    if (response.status === 401) throw new Unauthorized('the token was refused');
    let body = null;
    try {
      body = await response.json();
    } catch (_) {
      body = null;
    }
    if (!response.ok) {
      // The service's error body: {"error": {"code", "message", "field"?}, "trace_id"}.
      const detail = body && typeof body.error === 'object' && body.error ? body.error : {};
      const error = new Error(
        (typeof detail.message === 'string' && detail.message) || 'HTTP ' + response.status,
      );
      error.status = response.status;
      error.code = detail.code;
      error.field = typeof detail.field === 'string' ? detail.field : null;
      throw error;
    }
    return body;
  }

  // ----- panels of their own ---------------------------------------------------------------

  /**
   * Registered panels: `{refresh(isCurrent), clear()}`. `refresh` shows its own errors and
   * resolves when done; `isCurrent()` is false once the token it started with has changed.
   */
  const panels = [];

  /** What a refused token does anywhere on the page. */
  const REFUSED = 'The admin listener refused the token (401). Enter it again.';

  // ----- token ------------------------------------------------------------------------------

  function askForToken(message) {
    token = null;
    generation += 1;
    clearTimeout(timer);
    timer = null;
    clearBoard();
    byId('board').hidden = true;
    byId('forget').hidden = true;
    byId('pause').hidden = true;
    byId('login').hidden = false;
    byId('login-message').textContent = message || '';
    byId('summary').replaceChildren();
    byId('refreshed').textContent = '';
    byId('token').focus();
  }

  /** What was shown for the previous token goes with it. */
  function clearBoard() {
    for (const id of ['instance', 'shedding', 'dependencies', 'caches', 'events', 'consistency', 'slow-requests', 'detail-facts', 'detail-stages']) {
      byId(id).replaceChildren();
    }
    byId('slow-summary').textContent = '';
    byId('detail').hidden = true;
    byId('error').hidden = true;
    selected = null;
    for (const panel of panels) panel.clear();
  }

  function useToken(value) {
    token = value;
    generation += 1;
    paused = false;
    byId('pause').textContent = 'Pause';
    byId('login').hidden = true;
    byId('login-message').textContent = '';
    byId('board').hidden = false;
    byId('forget').hidden = false;
    byId('pause').hidden = false;
    refresh();
  }

  // ----- the refresh loop -------------------------------------------------------------------

  function schedule() {
    clearTimeout(timer);
    timer = paused ? null : setTimeout(refresh, REFRESH_MS);
  }

  async function refresh() {
    clearTimeout(timer);
    timer = null;
    if (token === null) return;
    const mine = generation;
    const isCurrent = () => mine === generation;
    // Panels show their own errors; the board's refresh waits for them, not on them.
    const others = Promise.allSettled(panels.map((panel) => panel.refresh(isCurrent)));
    try {
      const [status, slow] = await Promise.all([
        api('/admin/v1/status'),
        api('/admin/v1/slow-requests'),
      ]);
      if (mine !== generation) return;
      render(status, slow);
      byId('error').hidden = true;
      byId('refreshed').textContent = 'updated ' + new Date().toLocaleTimeString('en-GB');
    } catch (error) {
      if (mine !== generation) return;
      if (error instanceof Unauthorized) {
        askForToken(REFUSED);
        return;
      }
      const banner = byId('error');
      banner.textContent = 'Could not refresh (' + error.message + '); trying again every ' + REFRESH_MS / 1000 + ' s.';
      banner.hidden = false;
    }
    await others;
    if (mine === generation) schedule();
  }

  function render(status, slow) {
    renderSummary(status);
    renderInstance(status);
    renderShedding(status);
    renderDependencies(status);
    renderCaches(status);
    renderEvents(status);
    renderConsistency(status);
    renderSlowRequests(slow);
  }

  function renderSummary(status) {
    const parts = [
      status.ready ? badge('ready', 'ok') : badge('not ready', 'bad'),
      el('span', 'muted', 'shed level'),
      levelBadge(status.shed_level),
    ];
    if (Array.isArray(status.degraded) && status.degraded.length > 0) {
      parts.push(badge('degraded: ' + status.degraded.join(', '), 'warn'));
    }
    byId('summary').replaceChildren(...parts);
  }

  function renderInstance(status) {
    const connections = status.connections || {};
    const memory = status.memory || {};
    const queue = connections.listen_queue;
    facts(byId('instance'), [
      ['Ready', status.ready ? badge('yes', 'ok') : badge('no', 'bad')],
      ['Phase', String(status.phase)],
      ['Store', badge(String(status.store), status.store === 'ok' ? 'ok' : 'bad')],
      ['Redis', badge(String(status.redis), status.redis === 'down' ? 'bad' : status.redis === 'ok' ? 'ok' : 'muted')],
      ['Degraded', status.degraded && status.degraded.length ? status.degraded.join(', ') : 'nothing'],
      ['Pinged', duration(status.pinged_ms_ago) + ' ago'],
      ['Connections', num(connections.open) + ' open (' + num(connections.idle) + ' idle) · ' +
        num(connections.accepted) + ' accepted · ' +
        num((connections.refused_listener_full || 0) + (connections.refused_peer_full || 0)) + ' refused'],
      connections.idle_closes ? ['Idle connections', 'timeout ' + duration(connections.idle_timeout_ms) + ' · ' +
        num(connections.idle_closes.evicted_for_new) + ' closed for a new one · ' +
        num(connections.idle_closes.idle_timeout) + ' at the timeout'] : null,
      queue ? ['Accept queue', num(queue.queued) + ' of ' + num(queue.backlog)] : null,
      ['Store loads', 'at most ' + num(status.store_loads_max_in_flight) + ' in flight'],
      status.bloom ? ['Bloom gate', (status.bloom.ready ? 'ready' : 'building') + ' · ' + num(status.bloom.keys) +
        ' keys · ' + num(status.bloom.rejections) + ' of ' + num(status.bloom.checks) + ' refused'] : null,
      ['Memory', 'RSS ' + bytes(memory.rss_bytes) + ' · ' + String(memory.allocator || '?')],
    ]);
  }

  function renderShedding(status) {
    const root = byId('shedding');
    const protection = status.protection || {};
    const shed = protection.shedding;
    const blocks = [];
    if (!shed) {
      blocks.push(emptyNote('Load shedding is disabled (resilience.shedding.enabled = false).'));
    } else {
      const thresholds = Array.isArray(shed.thresholds) ? shed.thresholds : [];
      const topThreshold = thresholds.length ? thresholds[thresholds.length - 1] : 1;
      const loadTone = shed.load >= topThreshold ? 'bad' : thresholds.length && shed.load >= thresholds[0] ? 'warn' : 'ok';
      const list = el('dl', 'facts');
      facts(list, [
        ['Level', [levelBadge(shed.level), shed.forced ? badge('forced: ' + shed.forced, 'warn') : null,
          el('span', 'muted', ' held ' + duration(shed.level_since_ms))]],
        ['Load', [meter(shed.load, Math.max(topThreshold, 1) * 1.25, loadTone), ' ', num(shed.load, 3),
          el('span', 'muted', ' (levels at ' + thresholds.map((t) => num(t, 2)).join(' / ') + ')')]],
        ['In flight', [meter(shed.standing_in_flight, shed.concurrency_limit, 'info'), ' ', num(shed.in_flight) +
          ' now · ' + num(shed.standing_in_flight, 1) + ' standing · limit ' + num(shed.concurrency_limit)]],
        ['Queue delay', [meter(shed.queue_delay_ms, shed.queue_delay_target_ms, 'info'), ' ', ms(shed.queue_delay_ms) +
          ' of ' + ms(shed.queue_delay_target_ms) + ' target']],
        ['Latency', ms(shed.latency_ms) + ' · baseline ' + ms(shed.baseline_latency_ms)],
        ['Throughput', rps(shed.throughput_rps) + ' done · ' + rps(shed.offered_rps) + ' offered · ' +
          rps(shed.mean_offered_rps) + ' mean offered'],
        ['Saturated at', isNumber(shed.saturated_rps) ? rps(shed.saturated_rps) : 'not yet'],
      ]);
      blocks.push(list);
    }
    const refused = protection.refused_by_class || {};
    const client = protection.client_limit;
    const more = el('dl', 'facts');
    facts(more, [
      ['Refused by class', Object.keys(refused).length
        ? Object.entries(refused).map(([name, count]) => name + ' ' + num(count)).join(' · ')
        : 'none'],
      client ? ['Client limit', num(client.per_sec, 1) + '/s, burst ' + num(client.burst) + ' (' + String(client.scope) +
        ') · ' + num(client.clients_tracked) + ' clients · ' + num(client.refused) + ' refused'] : ['Client limit', 'off'],
    ]);
    blocks.push(more);
    root.replaceChildren(...blocks);
  }

  function renderDependencies(status) {
    const dependencies = ((status.protection || {}).dependencies) || [];
    if (dependencies.length === 0) {
      byId('dependencies').replaceChildren(emptyNote('No dependency reported.'));
      return;
    }
    const rows = dependencies.map((dependency) => {
      const breaker = dependency.breaker || {};
      const thresholds = dependency.breaker_thresholds || {};
      const bulkhead = dependency.bulkhead || {};
      const quota = dependency.quota;
      const retry = dependency.retry;
      const breakerCell = [breakerBadge(breaker.state)];
      if (isNumber(breaker.open_for_ms)) breakerCell.push(el('span', 'muted', ' ' + duration(breaker.open_for_ms) + ' left'));
      if (isNumber(breaker.probe_stage)) breakerCell.push(el('span', 'muted', ' probe stage ' + breaker.probe_stage));
      return {
        className: breaker.state === 'closed' ? null : 'alarm',
        cells: [
          el('strong', null, String(dependency.name)),
          breakerCell,
          [num(breaker.calls) + ' calls · ' + pct(breaker.failure_ratio) + ' failed',
            el('span', 'muted', ' (opens at ' + pct(thresholds.failure_ratio) + ' of ' + num(thresholds.min_calls) + '+)')],
          num(breaker.trips) + (breaker.consecutive_trips ? ' (' + breaker.consecutive_trips + ' in a row)' : ''),
          [meter(bulkhead.in_flight, bulkhead.max, 'info'), ' ', num(bulkhead.in_flight) + ' / ' + num(bulkhead.max) +
            ' · peak ' + num(bulkhead.peak)],
          quota
            ? num(quota.per_second, 1) + '/s, burst ' + num(quota.burst) + ' · ' + num(quota.granted) + ' granted · ' +
              num(quota.refused) + ' refused' + (quota.fleet ? ' · fleet of ' + num(quota.fleet.live_instances) +
              (quota.fleet.reachable ? '' : ' (unreachable)') : '')
            : '—',
          retry ? num(retry.retries) + ' retries · ' + num(retry.refused) + ' refused (' + pct(retry.ratio) + ' budget)' : '—',
          isNumber(dependency.timeout_ms) ? ms(dependency.timeout_ms) : '—',
          num(dependency.attempts) + ' · ' + num(dependency.successes) + ' ok · ' + num(dependency.failures) + ' failed · ' +
            num(dependency.timeouts) + ' timed out',
          num(dependency.rejected_breaker) + ' / ' + num(dependency.rejected_bulkhead) + ' / ' + num(dependency.rejected_quota) +
            (isNumber(dependency.rejected_hot_item) ? ' / ' + num(dependency.rejected_hot_item) : ''),
        ],
      };
    });
    byId('dependencies').replaceChildren(
      table(
        ['Dependency', 'Breaker', 'Window', 'Trips', 'Bulkhead', 'Quota', 'Retry budget', 'Timeout', 'Calls', 'Refused by breaker / bulkhead / quota / hot item'],
        rows,
        'grid',
      ),
    );
  }

  function ratioCell(hits, misses) {
    const ratio = hitRatio(hits, misses);
    if (ratio === null) return el('span', 'muted', '—');
    return [meter(ratio, 1, ratio >= 0.9 ? 'ok' : ratio >= 0.5 ? 'warn' : 'bad'), ' ', pct(ratio)];
  }

  const PARTS = ['product', 'rate', 'coupons', 'extras'];
  const partRank = (name) => (PARTS.includes(name) ? PARTS.indexOf(name) : PARTS.length);

  function renderCaches(status) {
    const caches = status.caches || {};
    // The parts in the order a quote is assembled, then any other the status names.
    const names = Object.keys(caches).sort((a, b) => partRank(a) - partRank(b) || a.localeCompare(b));
    const blocks = [];
    if (names.length === 0) {
      blocks.push(emptyNote('No cache reported.'));
    } else {
      const total = { hits: 0, misses: 0, l2_hits: 0, l2_misses: 0 };
      const rows = names.map((name) => {
        const stats = caches[name] || {};
        for (const key of Object.keys(total)) total[key] += stats[key] || 0;
        return [
          el('strong', null, name),
          ratioCell(stats.hits, stats.misses),
          num(stats.hits) + ' / ' + num(stats.misses),
          ratioCell(stats.l2_hits, stats.l2_misses),
          num(stats.l2_hits) + ' / ' + num(stats.l2_misses) + (stats.l2_errors ? ' · ' + num(stats.l2_errors) + ' errors' : ''),
          num(stats.source_loads),
          num(stats.loads_started) + ' started · ' + num(stats.loads_joined) + ' joined · ' + num(stats.load_failures) + ' failed',
          num(stats.stale_served),
          num(stats.entries),
        ];
      });
      rows.push({
        className: 'total',
        cells: [
          el('strong', null, 'all parts'),
          ratioCell(total.hits, total.misses),
          num(total.hits) + ' / ' + num(total.misses),
          ratioCell(total.l2_hits, total.l2_misses),
          num(total.l2_hits) + ' / ' + num(total.l2_misses),
          '', '', '', '',
        ],
      });
      blocks.push(
        table(
          ['Part', 'L1 hit ratio', 'L1 hits / misses', 'L2 hit ratio', 'L2 hits / misses', 'Source loads', 'Loads', 'Stale served', 'L1 entries'],
          rows,
          'grid',
        ),
      );
      blocks.push(emptyNote('L2 is looked up only on an L1 miss; "—" is a tier nothing was looked up in (no Redis, or no traffic yet).'));
    }
    const rendered = status.rendered_quotes;
    const list = el('dl', 'facts');
    facts(list, [
      ['Kept renderings', rendered
        ? num(rendered.hits) + ' answered · ' + num(rendered.entries) + ' kept · ' + bytes(rendered.bytes) + ' of ' +
          bytes(rendered.capacity_bytes) + ' · ' + num(rendered.fenced) + ' fenced'
        : 'off'],
      ['Cache-only loads', num(status.cache_only_loads)],
      status.upstream_batches ? ['Upstream batches', ['coupons', 'extras'].map((api) => {
        const batch = status.upstream_batches[api];
        return batch ? api + ' ' + num(batch.calls) + ' calls, ' + num(batch.items) + ' items' : api + ' single calls';
      }).join(' · ')] : null,
    ]);
    blocks.push(list);
    byId('caches').replaceChildren(...blocks);
  }

  function renderEvents(status) {
    const connection = status.events_connection;
    const counts = status.event_counts;
    const pairs = [
      ['Backend', connection === 'in_process' ? 'in process' : 'RabbitMQ'],
      ['State', badge(String(status.events), status.events === 'connected' ? 'ok' : 'bad')],
    ];
    if (connection && typeof connection === 'object') {
      pairs.push(['Since', connection.since ? String(connection.since) : '—']);
      pairs.push(['Reconnects', num(connection.reconnects)]);
      if (connection.last_error) pairs.push(['Last error', el('span', 'error-text', String(connection.last_error))]);
      const catchUp = connection.last_catch_up;
      if (catchUp) {
        pairs.push(['Last catch-up', String(catchUp.outcome) + ' after ' + duration(catchUp.disconnected_ms) + ' away' +
          (isNumber(catchUp.backlog) ? ' · ' + num(catchUp.backlog) + ' waiting' : '') + ' (' + String(catchUp.at) + ')']);
      }
    }
    if (counts) {
      pairs.push(['Published', num(counts.published)]);
      pairs.push(['Processed', num(counts.processed)]);
      pairs.push(['Failed', [num(counts.failed), el('span', 'muted', ' (' + num(counts.redelivered) + ' redelivered · ' +
        num(counts.dead_lettered) + ' dead-lettered · ' + num(counts.abandoned) + ' abandoned)')]]);
    }
    facts(byId('events'), pairs);
  }

  function renderConsistency(status) {
    const root = byId('consistency');
    const report = status.consistency;
    if (!report) {
      root.replaceChildren(emptyNote('This instance reports no consistency observer.'));
      return;
    }
    const list = el('dl', 'facts');
    const drift = report.drift;
    facts(list, [
      ['Observer', report.enabled ? badge('on', 'ok') : badge('off', 'muted')],
      ['Sampled', pct(report.sample_ratio) + ' of applied events'],
      ['Pending', num(report.pending) + ' under observation · ' + num(report.skipped) + ' skipped'],
      ['Ahead of the store', num(report.ahead_of_store) + ' events (a version the store never reached)'],
      drift && ['Drift sampler', drift.keys_per_sec > 0
        ? num(drift.keys_per_sec) + ' keys/s · ' + num(drift.drawn) + ' drawn · ' + num(drift.following) +
          ' followed · ' + num(drift.skipped) + ' skipped'
        : badge('off', 'muted')],
    ]);
    // Per source (event, binlog, sample) when the instance reports them, else the events' total.
    const sources = report.sources && typeof report.sources === 'object'
      ? Object.entries(report.sources)
      : [['events', report.windows]];
    const rows = sources.flatMap(([source, windows]) => (Array.isArray(windows) ? windows : []).map((window) => ({
      className: window.inconsistent > 0 ? 'alarm' : null,
      cells: [
        String(source),
        duration(window.window_ms) + ' after',
        num(window.consistent),
        num(window.inconsistent),
        num(window.unknown),
        num(window.ahead_of_store),
        window.inconsistent > 0 ? num(window.nines, 2) + ' nines'
          : window.consistent > 0 ? 'all consistent (≥ ' + num(window.nines, 1) + ' nines)' : '—',
      ],
    })));
    root.replaceChildren(
      list,
      rows.length
        ? table(['Source', 'Checked', 'Consistent', 'Inconsistent', 'Unknown', 'Ahead of store', 'Consistency'], rows, 'grid')
        : emptyNote('No check window configured.'),
    );
  }

  function renderSlowRequests(slow) {
    const requests = (slow && Array.isArray(slow.requests)) ? slow.requests : [];
    byId('slow-summary').textContent = num(slow && slow.recorded) + ' recorded (the log keeps the last ' +
      num(slow && slow.capacity) + ' slow, failed or degraded requests); newest first. Select a trace id for its stages.';
    if (requests.length === 0) {
      byId('slow-requests').replaceChildren(emptyNote('No slow, failed or degraded request yet.'));
      return;
    }
    const rows = requests.map((request) => {
      const open = el('button', 'link', String(request.trace_id));
      open.type = 'button';
      open.title = 'Show the stages of this request';
      open.addEventListener('click', () => openTrace(String(request.trace_id)));
      return {
        traceId: String(request.trace_id),
        className: request.trace_id === selected ? 'selected' : null,
        cells: [
          String(request.at),
          open,
          String(request.method) + ' ' + String(request.path),
          badge(String(request.status), request.status >= 500 ? 'bad' : request.status >= 400 ? 'warn' : 'ok'),
          ms(request.latency_ms),
          num(request.shed_level),
          request.class ? String(request.class) : '—',
          Array.isArray(request.reasons) ? request.reasons.join(', ') : '',
        ],
      };
    });
    byId('slow-requests').replaceChildren(
      table(['Ended', 'Trace id', 'Request', 'Status', 'Latency', 'Level', 'Class', 'Why recorded'], rows, 'grid'),
    );
  }

  // ----- one request's stages ---------------------------------------------------------------

  function markSelected() {
    for (const row of byId('slow-requests').querySelectorAll('tr[data-trace-id]')) {
      row.classList.toggle('selected', row.dataset.traceId === selected);
    }
  }

  async function openTrace(traceId) {
    const detail = byId('detail');
    const message = byId('detail-message');
    selected = traceId;
    markSelected();
    byId('detail-trace-id').textContent = traceId;
    byId('detail-facts').replaceChildren();
    byId('detail-stages').replaceChildren();
    message.hidden = true;
    detail.hidden = false;
    if (!TRACE_ID.test(traceId)) {
      message.textContent = 'A trace id is 32 lowercase hex digits.';
      message.hidden = false;
      return;
    }
    const mine = generation;
    let request;
    try {
      request = await api('/admin/v1/slow-requests/' + encodeURIComponent(traceId));
    } catch (error) {
      if (mine !== generation) return;
      if (error instanceof Unauthorized) {
        askForToken(REFUSED);
        return;
      }
      message.textContent = error.code === 'not_recorded'
        ? 'This instance has no record of that trace id: the request was fast and healthy, ran on another instance, or has been pushed out of the log.'
        : 'Could not load it: ' + error.message;
      message.hidden = false;
      return;
    }
    if (mine !== generation || selected !== traceId) return;
    renderDetail(request);
    detail.scrollIntoView({ block: 'nearest' });
  }

  function renderDetail(request) {
    facts(byId('detail-facts'), [
      ['Request', String(request.method) + ' ' + String(request.path)],
      ['Status', String(request.status)],
      ['Latency', ms(request.latency_ms)],
      ['Ended', String(request.at)],
      ['Instance', String(request.instance)],
      ['Shed level', num(request.shed_level)],
      ['Class', request.class ? String(request.class) : '—'],
      ['Why recorded', Array.isArray(request.reasons) ? request.reasons.join(', ') : ''],
    ]);
    const stages = Array.isArray(request.stages) ? request.stages : [];
    if (stages.length === 0) {
      byId('detail-stages').replaceChildren(emptyNote('No stage recorded: every part came from L1.'));
      return;
    }
    const span = Math.max(
      isNumber(request.latency_ms) ? request.latency_ms : 0,
      ...stages.map((stage) => (stage.started_ms || 0) + (stage.elapsed_ms || 0)),
      1,
    );
    const rows = stages.map((stage) => {
      const track = el('span', 'waterfall');
      const bar = el('span', 'bar ' + stageTone(stage));
      bar.style.marginLeft = ((stage.started_ms || 0) / span * 100).toFixed(2) + '%';
      bar.style.width = Math.max((stage.elapsed_ms || 0) / span * 100, 0.4).toFixed(2) + '%';
      track.append(bar);
      return [
        String(stage.kind),
        el('strong', null, String(stage.name)),
        String(stage.outcome),
        isNumber(stage.attempt) ? String(stage.attempt) : '',
        ms(stage.started_ms),
        ms(stage.elapsed_ms),
        track,
      ];
    });
    byId('detail-stages').replaceChildren(
      table(['Stage', 'Of', 'Outcome', 'Attempt', 'Started at', 'Took', 'Timeline'], rows, 'grid stages'),
    );
  }

  function stageTone(stage) {
    const outcome = String(stage.outcome);
    if (/timeout|error|open|full|quota|fail/.test(outcome)) return 'bad';
    if (/stale|template|shed|miss/.test(outcome)) return 'warn';
    return 'ok';
  }

  // ----- wiring -----------------------------------------------------------------------------

  function start() {
    byId('token-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const input = byId('token');
      const value = input.value.trim();
      input.value = '';
      if (value === '') {
        byId('login-message').textContent = 'Enter the admin token.';
        return;
      }
      useToken(value);
    });
    byId('forget').addEventListener('click', () => askForToken('Token forgotten.'));
    byId('pause').addEventListener('click', () => {
      paused = !paused;
      byId('pause').textContent = paused ? 'Resume' : 'Pause';
      if (paused) {
        clearTimeout(timer);
        timer = null;
      } else {
        refresh();
      }
    });
    byId('trace-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const value = byId('trace-id').value.trim().toLowerCase();
      if (value !== '') openTrace(value);
    });
    byId('detail-close').addEventListener('click', () => {
      selected = null;
      markSelected();
      byId('detail').hidden = true;
    });
    // A hidden tab's timers are throttled; catch up as soon as it is looked at again.
    document.addEventListener('visibilitychange', () => {
      if (!document.hidden && token !== null && !paused) refresh();
    });
    byId('token').focus();
  }

  window.rebateDashboard = Object.freeze({
    /** Adds a panel (see `panels`). */
    register(panel) {
      panels.push(panel);
    },
    /** A 401 anywhere: the token is forgotten and asked for again. */
    refused() {
      askForToken(REFUSED);
    },
    /** A check that stays true while the token of now is in use (answers to an older one are dropped). */
    session() {
      const mine = generation;
      return () => mine === generation && token !== null;
    },
    Unauthorized,
    api,
    byId,
    el,
    facts,
    table,
    badge,
    emptyNote,
    isNumber,
    num,
    pct,
    ms,
    duration,
  });

  start();
})();
