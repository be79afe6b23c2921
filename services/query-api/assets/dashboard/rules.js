// The operator dashboard's live-rules panel (served beside app.js by
// services/query-api/src/http/dashboard.rs; it uses app.js's helpers through
// window.rebateDashboard, so it never sees the token). It shows what GET /admin/v1/rules and
// /admin/v1/rules/history say: the active version and its document, the version each instance
// runs, a canary's instances, time left, figures and verdict, and the history with each version's
// diff. It changes the rules in two steps: "Dry run" posts the editor's document with
// ?dry_run=true and shows the diff (or the refusal's field and message); "Apply", enabled only for
// the exact text, author and reason of a successful dry run, posts it and follows the new version
// until every live instance reports it. Data only ever becomes text nodes.
'use strict';

(() => {
  const board = window.rebateDashboard;
  // Without app.js there is no board to plug into (and it shows nothing either).
  if (!board) return;
  const { api, byId, el, facts, table, badge, emptyNote, isNumber, num, pct, duration, Unauthorized } = board;

  const RULES = '/admin/v1/rules';
  const HISTORY_LIMIT = 20;
  /** After an apply: how often the instances' versions are asked for, and for how long. */
  const FOLLOW_EVERY_MS = 500;
  const FOLLOW_FOR_MS = 120_000;
  const STATE_TONES = {
    active: 'ok',
    canary: 'warn',
    scheduled: 'muted',
    staged: 'muted',
    superseded: 'muted',
    rolled_back: 'bad',
    aborted: 'bad',
    expired: 'muted',
  };

  /** The editor's text as last filled from the active version: equal to it means not edited. */
  let editorBase = null;
  /** The request of the last successful dry run (as `requestKey`): Apply sends only that. */
  let dryRunKey = null;
  /** The version stored by Apply, followed until every instance runs it: {version, state, since}. */
  let following = null;
  /** The newest history, for the last verdict when no canary runs. */
  let lastHistory = [];

  // ----- formatting -------------------------------------------------------------------------

  /** A value as JSON (45, "core"); `unset` for null. */
  const valueText = (value, unset) => (value === null || value === undefined ? unset : JSON.stringify(value));
  const text = (value) => (value === null || value === undefined ? '—' : String(value));
  const stateBadge = (state) => badge(String(state).replace('_', ' '), STATE_TONES[state] || 'muted');

  /**
   * A diff as a list, one `key: from → to` a line, each line marked with its key. A dry run's
   * diff is of the values in force (null: a key with no value, e.g. no quota); the history's is
   * of each document against the one before (null: the document leaves the key to the file).
   */
  function diffList(diff, { id = null, unset = 'null' } = {}) {
    const changes = Array.isArray(diff) ? diff : [];
    if (changes.length === 0) return emptyNote('No change: every key keeps the value in force.');
    const list = el(
      'ul',
      'diff',
      changes.map((change) => {
        const line = el('li', null, el('code', null, String(change.key)), ': ' + valueText(change.from, unset) + ' → ' +
          valueText(change.to, unset));
        line.dataset.key = String(change.key);
        return line;
      }),
    );
    if (id) list.id = id;
    return list;
  }

  /** An instance's own figures for a canary (`during` or `before` it). */
  function figuresText(figures) {
    if (!figures) return '—';
    const ratio = figures.answered > 0 ? figures.complete / figures.answered : null;
    return num(figures.requests) + ' requests · ' + pct(ratio) + ' complete · ' + num(figures.trips) + ' trips · shed level ' +
      num(figures.max_shed_level);
  }

  /** A verdict side's summary. */
  function summaryText(summary) {
    if (!summary) return '—';
    return num(summary.requests) + ' requests · ' + pct(summary.success_ratio) + ' complete · p99 ' +
      (isNumber(summary.p99_ms) ? num(summary.p99_ms, 1) + ' ms' : '—') + ' · ' + num(summary.trips_per_instance, 1) +
      ' trips per instance · shed level ' + num(summary.max_shed_level);
  }

  function verdictBlock(verdict) {
    const tone = verdict.decision === 'promote' ? 'ok' : verdict.decision === 'roll_back' ? 'bad' : 'warn';
    const list = el('dl', 'facts');
    facts(list, [
      ['Verdict', [badge(String(verdict.decision).replace('_', ' '), tone), el('span', 'muted', ' by ' + text(verdict.by))]],
      ['Why', Array.isArray(verdict.reasons) && verdict.reasons.length ? verdict.reasons.join('; ') : '—'],
      ['Canary', summaryText(verdict.canary)],
      ['Baseline', [text(verdict.baseline) + ': ', summaryText(verdict.reference)]],
    ]);
    return list;
  }

  /** Every live instance, this one included even before its first report. */
  function instancesOf(overview) {
    const instances = Array.isArray(overview.instances) ? overview.instances.slice() : [];
    const self = overview.this_instance;
    if (self && !instances.some((instance) => instance.instance_id === self.instance_id)) instances.push(self);
    return instances;
  }

  /** The version an instance should run: the canary's when it is one of its instances. */
  function meantFor(overview, instanceId) {
    const canary = overview.canary;
    const rollout = canary && canary.rollout;
    if (rollout && Array.isArray(rollout.instances) && rollout.instances.includes(instanceId)) return canary.version;
    return overview.active ? overview.active.version : 0;
  }

  // ----- rendering --------------------------------------------------------------------------

  function render(overview, history) {
    lastHistory = Array.isArray(history) ? history : [];
    renderActive(overview);
    renderInstances(overview);
    renderCanary(overview);
    renderHistory(lastHistory);
    fillEditor(overview.active);
    showProgress(overview);
  }

  function renderActive(overview) {
    const active = overview.active;
    const documentView = byId('rules-document');
    if (!active) {
      facts(byId('rules-active'), [['Version', 'none: every instance runs its config file\'s values']]);
      documentView.hidden = true;
      documentView.textContent = '';
    } else {
      facts(byId('rules-active'), [
        ['Version', el('strong', null, String(active.version))],
        ['Active since', text(active.activated_at)],
        ['Author', text(active.author)],
        ['Reason', text(active.reason)],
        isNumber(active.previous_version) ? ['Replaced', 'version ' + active.previous_version] : null,
      ]);
      documentView.textContent = JSON.stringify(active.document, null, 2);
      documentView.hidden = false;
    }
    const scheduled = Array.isArray(overview.scheduled) ? overview.scheduled : [];
    byId('rules-scheduled').replaceChildren(
      ...scheduled.map((version) => el('p', 'muted', 'Scheduled: version ' + version.version + ', ' +
        text(version.schedule && version.schedule.from) + ' – ' + text(version.schedule && version.schedule.until) +
        ' (' + text(version.author) + ': ' + text(version.reason) + ')')),
    );
  }

  function renderInstances(overview) {
    const self = overview.this_instance || {};
    const canaryVersion = overview.canary ? overview.canary.version : null;
    const instances = instancesOf(overview);
    const rows = instances.map((instance) => {
      const meant = meantFor(overview, instance.instance_id);
      const figures = instance.canary && instance.canary.version === canaryVersion ? instance.canary : null;
      return {
        className: instance.applied_version === meant ? null : 'pending',
        cells: [
          [el('code', null, text(instance.instance_id)), instance.instance_id === self.instance_id ? badge('this instance', 'muted') : null],
          badge(String(instance.applied_version), instance.applied_version === meant ? 'ok' : 'warn'),
          canaryVersion !== null && meant === canaryVersion ? 'canary ' + canaryVersion : String(meant),
          text(instance.reported_at),
          figures ? figuresText(figures.during) : '—',
        ],
      };
    });
    const rendered = table(['Instance', 'Applied', 'Should run', 'Reported', 'Canary figures (since it began)'], rows, 'grid');
    // Each row says whose it is, for whoever reads the page by script (the browser test).
    instances.forEach((instance, index) => {
      rendered.tBodies[0].rows[index].dataset.instance = String(instance.instance_id);
    });
    byId('rules-instances').replaceChildren(rendered);
  }

  function renderCanary(overview) {
    const root = byId('rules-canary');
    const canary = overview.canary;
    if (!canary) {
      const decided = lastHistory.find((version) => version.verdict && typeof version.verdict === 'object');
      root.replaceChildren(
        emptyNote('No canary running.'),
        ...(decided ? [el('p', null, 'The last verdict, on version ' + decided.version + ':'), verdictBlock(decided.verdict)] : []),
      );
      return;
    }
    const rollout = canary.rollout || {};
    const instances = Array.isArray(rollout.instances) ? rollout.instances : [];
    const observeMs = (rollout.observe_secs || 0) * 1000;
    const leftMs = Math.max((rollout.started_at_ms || 0) + observeMs - Date.now(), 0);
    const track = el('span', 'meter');
    const fill = el('span', 'fill warn');
    fill.style.width = (observeMs > 0 ? Math.min((observeMs - leftMs) / observeMs, 1) * 100 : 100).toFixed(1) + '%';
    track.append(fill);
    const list = el('dl', 'facts');
    facts(list, [
      ['Version', [el('strong', null, String(canary.version)), el('span', 'muted', ' by ' + text(canary.author) + ': ' + text(canary.reason))]],
      ['Instances', instances.join(', ') + ' (' + instances.length + ' of ' + instancesOf(overview).length + ' live)'],
      ['Window', [track, ' ', leftMs > 0 ? duration(leftMs) + ' left of ' + duration(observeMs) : 'over: the verdict is due']],
      canary.verdict ? null : ['Verdict', 'pending: at the window\'s end, or as soon as a figure breaks its margin'],
    ]);
    const rows = instancesOf(overview)
      .filter((instance) => instance.canary && instance.canary.version === canary.version)
      .map((instance) => [
        el('code', null, text(instance.instance_id)),
        instances.includes(instance.instance_id) ? badge('canary', 'warn') : badge('baseline', 'muted'),
        figuresText(instance.canary.during),
        figuresText(instance.canary.before),
      ]);
    root.replaceChildren(
      list,
      ...(canary.verdict ? [verdictBlock(canary.verdict)] : []),
      rows.length
        ? table(['Instance', 'Side', 'Since it began', 'As long before'], rows, 'grid')
        : emptyNote('No figures reported yet.'),
    );
  }

  function renderHistory(history) {
    if (history.length === 0) {
      byId('rules-history').replaceChildren(emptyNote('No rule set yet: every instance runs its config file\'s values.'));
      return;
    }
    const rows = history.map((version) => [
      el('strong', null, String(version.version)),
      stateBadge(version.state),
      text(version.created_at),
      text(version.author),
      text(version.reason),
      diffList(version.diff, { unset: '(config file)' }),
      version.verdict && typeof version.verdict === 'object'
        ? [badge(String(version.verdict.decision).replace('_', ' '), version.verdict.decision === 'promote' ? 'ok' : 'bad'),
          ' ' + (Array.isArray(version.verdict.reasons) ? version.verdict.reasons.join('; ') : '')]
        : '—',
    ]);
    byId('rules-history').replaceChildren(
      table(['Version', 'State', 'Created', 'Author', 'Reason', 'Changes against the version before', 'Verdict'], rows, 'grid history'),
    );
  }

  // ----- the editor -------------------------------------------------------------------------

  /** The active document in the editor, unless the operator has edited it. */
  function fillEditor(active) {
    const editor = byId('rules-editor');
    if (editorBase !== null && editor.value !== editorBase) return;
    const filled = active ? JSON.stringify(active.document, null, 2) : '';
    if (editor.value === filled) {
      editorBase = filled;
      return;
    }
    editor.value = filled;
    editorBase = filled;
    formChanged();
  }

  /** The form as a request, or why it is not one. */
  function formRequest() {
    const source = byId('rules-editor').value;
    let documentValue;
    try {
      documentValue = JSON.parse(source);
    } catch (error) {
      return { problem: 'The document is not JSON: ' + error.message };
    }
    const body = {
      document: documentValue,
      author: byId('rules-author').value.trim(),
      reason: byId('rules-reason').value.trim(),
    };
    return { body, key: JSON.stringify([source, body.author, body.reason]) };
  }

  /** `Apply` is for the text of the last successful dry run only. */
  function formChanged() {
    const request = formRequest();
    const ready = dryRunKey !== null && request.key === dryRunKey;
    byId('rules-apply').disabled = !ready;
    if (dryRunKey !== null && !ready) {
      dryRunKey = null;
      outcome(['Changed since the dry run: run it again before applying.'], 'muted');
      byId('rules-diff').replaceChildren();
    }
  }

  /** The line under the buttons. */
  function outcome(parts, tone) {
    const line = byId('rules-outcome');
    line.className = tone || '';
    line.replaceChildren(...parts.map((part) => (part instanceof Node ? part : document.createTextNode(String(part)))));
  }

  /** A refusal: the key at fault and why, when the service names one. */
  function refusal(error, what) {
    if (error.field) {
      const reason = String(error.message).startsWith(error.field + ': ')
        ? String(error.message).slice(error.field.length + 2)
        : String(error.message);
      const field = el('code', null, error.field);
      field.id = 'rules-field';
      outcome([what + ' refused (' + error.status + ' ' + text(error.code) + '): ', field, ': ' + reason], 'alert');
    } else {
      outcome([what + ' refused (' + text(error.status) + ' ' + text(error.code) + '): ' + error.message], 'alert');
    }
  }

  function setBusy(busy) {
    byId('rules-dry-run').disabled = busy;
    if (busy) byId('rules-apply').disabled = true;
  }

  async function dryRun() {
    const request = formRequest();
    byId('rules-diff').replaceChildren();
    dryRunKey = null;
    byId('rules-apply').disabled = true;
    if (request.problem) {
      outcome([request.problem], 'alert');
      return;
    }
    const isCurrent = board.session();
    setBusy(true);
    outcome(['Dry run…'], 'muted');
    try {
      const answer = await api(RULES + '?dry_run=true', 'POST', request.body);
      if (!isCurrent()) return;
      dryRunKey = request.key;
      outcome(['Dry run: nothing was stored. Applying stores it as a new version, ' + text(answer.state) + ', changing:'], 'muted');
      byId('rules-diff').replaceChildren(diffList(answer.diff, { id: 'rules-dry-run-diff' }));
    } catch (error) {
      if (!isCurrent()) return;
      if (error instanceof Unauthorized) {
        board.refused();
        return;
      }
      refusal(error, 'Dry run');
    } finally {
      if (isCurrent()) {
        setBusy(false);
        byId('rules-apply').disabled = dryRunKey === null || formRequest().key !== dryRunKey;
      }
    }
  }

  async function apply() {
    const request = formRequest();
    if (request.problem || request.key !== dryRunKey) return;
    const isCurrent = board.session();
    setBusy(true);
    outcome(['Applying…'], 'muted');
    try {
      const created = await api(RULES, 'POST', request.body);
      if (!isCurrent()) return;
      dryRunKey = null;
      // The editor now holds the new active document: the next refresh may reformat it.
      editorBase = byId('rules-editor').value;
      following = { version: created.version, state: created.state, since: Date.now() };
      byId('rules-diff').replaceChildren(diffList(created.diff, { id: 'rules-applied-diff' }));
      outcome(['Version ' + created.version + ' stored (' + text(created.state) + ').'], 'muted');
      follow(isCurrent);
    } catch (error) {
      if (!isCurrent()) return;
      if (error instanceof Unauthorized) {
        board.refused();
        return;
      }
      refusal(error, 'Apply');
    } finally {
      if (isCurrent()) {
        setBusy(false);
        byId('rules-apply').disabled = true;
      }
    }
  }

  /** Asks for the instances' versions every FOLLOW_EVERY_MS until the followed one is everywhere. */
  async function follow(isCurrent) {
    const version = following && following.version;
    while (isCurrent() && following && following.version === version) {
      try {
        const [overview, history] = await Promise.all([api(RULES), api(RULES + '/history?limit=' + HISTORY_LIMIT)]);
        if (!isCurrent()) return;
        render(overview, history);
      } catch (error) {
        if (!isCurrent()) return;
        if (error instanceof Unauthorized) {
          board.refused();
          return;
        }
      }
      if (!following || following.version !== version) return;
      await new Promise((resolve) => setTimeout(resolve, FOLLOW_EVERY_MS));
    }
  }

  /** How far the followed version has got; done when every live instance runs it. */
  function showProgress(overview) {
    if (!following) return;
    const { version, state, since } = following;
    if (state !== 'active') {
      // A canary or a window is followed in its own section.
      following = null;
      return;
    }
    const instances = instancesOf(overview);
    const on = instances.filter((instance) => instance.applied_version === version);
    if (on.length === instances.length) {
      following = null;
      const applied = el('strong', null, 'Version ' + version + ' is applied on every instance');
      applied.id = 'rules-applied';
      applied.dataset.version = String(version);
      outcome([applied, ' (' + on.length + ' of ' + instances.length + ').'], 'ok-text');
      return;
    }
    const waiting = instances.filter((instance) => instance.applied_version !== version).map((instance) => instance.instance_id);
    if (Date.now() - since > FOLLOW_FOR_MS) {
      following = null;
      outcome(['Version ' + version + ' is not applied everywhere after ' + duration(FOLLOW_FOR_MS) + ': ' + waiting.join(', ') +
        ' still run another version (see their logs).'], 'alert');
      return;
    }
    outcome(['Version ' + version + ' stored: applied on ' + on.length + ' of ' + instances.length + ' instances; waiting for ' +
      waiting.join(', ') + '…'], 'muted');
  }

  // ----- the panel --------------------------------------------------------------------------

  async function refresh(isCurrent) {
    const message = byId('rules-message');
    try {
      const [overview, history] = await Promise.all([api(RULES), api(RULES + '/history?limit=' + HISTORY_LIMIT)]);
      if (!isCurrent()) return;
      render(overview, history);
      message.hidden = true;
    } catch (error) {
      if (!isCurrent()) return;
      if (error instanceof Unauthorized) {
        board.refused();
        return;
      }
      message.textContent = 'Could not read the live rules (' + error.message + ').';
      message.hidden = false;
    }
  }

  function clear() {
    for (const id of ['rules-active', 'rules-scheduled', 'rules-instances', 'rules-canary', 'rules-history', 'rules-diff', 'rules-outcome']) {
      byId(id).replaceChildren();
    }
    const documentView = byId('rules-document');
    documentView.textContent = '';
    documentView.hidden = true;
    byId('rules-message').hidden = true;
    byId('rules-editor').value = '';
    byId('rules-author').value = '';
    byId('rules-reason').value = '';
    byId('rules-apply').disabled = true;
    byId('rules-dry-run').disabled = false;
    editorBase = null;
    dryRunKey = null;
    following = null;
    lastHistory = [];
  }

  for (const id of ['rules-editor', 'rules-author', 'rules-reason']) {
    byId(id).addEventListener('input', formChanged);
  }
  byId('rules-dry-run').addEventListener('click', dryRun);
  byId('rules-form').addEventListener('submit', (event) => {
    event.preventDefault();
    apply();
  });
  board.register({ refresh, clear });
})();
