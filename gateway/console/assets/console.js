// Switchboard operator console. Plain ES2020, no framework, no build step.
// It reads /admin/console/* and /admin/keys with the admin token (kept in
// sessionStorage, sent as Authorization: Bearer, never in a URL) and acts
// through the admin API. Tables are updated in place, one keyed row per
// engine, key and request, so a fleet of hundreds stays smooth.
'use strict';

(() => {
  const TOKEN_KEY = 'switchboard-admin-token';
  const FAST_MS = 1000;
  const SLOW_MS = 10000;

  const $ = (sel, root = document) => root.querySelector(sel);
  const el = (tag, attrs = {}, text) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const setText = (node, text) => {
    const s = text === null || text === undefined ? '' : String(text);
    if (node.textContent !== s) node.textContent = s;
  };
  const fmt = (v, digits = 0) => (v === null || v === undefined ? '–' : Number(v).toFixed(digits));
  const ms = (sec) => (sec === null || sec === undefined ? '–' : (sec * 1000).toFixed(sec < 0.1 ? 1 : 0) + ' ms');

  // ---- auth and fetch ----
  let token = sessionStorage.getItem(TOKEN_KEY) || '';
  let needToken = false;
  let pending = null; // the write action to retry once a token is given

  class AuthError extends Error {}

  async function api(path, opts = {}) {
    const headers = Object.assign({ Accept: 'application/json' }, opts.headers || {});
    if (token) headers.Authorization = 'Bearer ' + token;
    const resp = await fetch(path, {
      method: opts.method || 'GET',
      headers,
      body: opts.body,
      cache: 'no-store',
      credentials: 'same-origin',
      redirect: 'error',
    });
    // Only a 401 asks for a token: a 403 (a read-only token on a write,
    // a cross-origin or host refusal, no token configured at all) is not
    // one a token typed in would cure, so it is shown and polling goes on.
    if (resp.status === 401) {
      let msg = 'admin token needed';
      try { msg = (await resp.json()).error.message || msg; } catch (_) { /* not JSON */ }
      askToken(msg);
      throw new AuthError(msg);
    }
    return resp;
  }

  async function apiJSON(path, opts) {
    const resp = await api(path, opts);
    if (!resp.ok) throw new Error(await errorText(resp));
    return resp.json();
  }

  async function errorText(resp) {
    try {
      const body = await resp.json();
      if (body && body.error && body.error.message) return resp.status + ': ' + body.error.message;
    } catch (_) { /* not JSON */ }
    return 'HTTP ' + resp.status;
  }

  function askToken(msg) {
    needToken = true;
    $('#token-form').classList.remove('hidden');
    setStatus(msg, false);
    $('#token').focus();
  }

  $('#token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    token = $('#token').value.trim();
    $('#token').value = '';
    if (token) sessionStorage.setItem(TOKEN_KEY, token); else sessionStorage.removeItem(TOKEN_KEY);
    $('#token-form').classList.add('hidden');
    $('#forget-token').classList.toggle('hidden', !token);
    needToken = false;
    const retry = pending;
    pending = null;
    if (retry) retry();
    kick();
  });
  $('#forget-token').classList.toggle('hidden', !token);
  $('#forget-token').addEventListener('click', () => {
    token = '';
    sessionStorage.removeItem(TOKEN_KEY);
    $('#forget-token').classList.add('hidden');
  });

  // A write action: on an auth failure it is kept and retried once the
  // token is given.
  async function act(fn) {
    try {
      await fn();
    } catch (err) {
      if (err instanceof AuthError) { pending = () => act(fn); return; }
      setStatus(err.message, false);
      holdStatus = Date.now() + 8000; // the polls' "live" does not hide it at once
    }
  }

  let holdStatus = 0;
  function setStatus(text, ok) {
    if (ok && Date.now() < holdStatus) return;
    const s = $('#status');
    setText(s, text);
    s.classList.toggle('live', !!ok);
  }

  // ---- polling ----
  const pollers = [];
  function poller(fn, every) {
    const p = { fn, every, timer: 0, busy: false };
    p.run = async () => {
      clearTimeout(p.timer);
      if (p.busy) return;
      if (document.hidden || needToken) { p.timer = setTimeout(p.run, every); return; }
      p.busy = true;
      try {
        await fn();
        setStatus('live', true);
      } catch (err) {
        if (!(err instanceof AuthError)) setStatus(err.message || String(err), false);
      } finally {
        p.busy = false;
        p.timer = setTimeout(p.run, every);
      }
    };
    pollers.push(p);
    return p;
  }
  function kick() { for (const p of pollers) p.run(); }
  document.addEventListener('visibilitychange', () => { if (!document.hidden) kick(); });

  // ---- engines ----
  const engineRows = new Map();
  let enginesETag = '';
  const engineBody = $('#engines-table tbody');
  const ENGINE_FIELDS = ['state', 'role', 'tier', 'prefill', 'decode', 'queue', 'kv', 'ejections', 'error'];

  function engineRow(name) {
    let row = engineRows.get(name);
    if (row) return row;
    const tr = el('tr', { 'data-engine': name });
    tr.appendChild(el('td', { 'data-field': 'name' }, name));
    const cells = {};
    for (const f of ENGINE_FIELDS) {
      const td = el('td', { 'data-field': f });
      if (['tier', 'prefill', 'decode', 'queue', 'kv', 'ejections'].includes(f)) td.classList.add('num');
      if (f === 'error') td.classList.add('err');
      cells[f] = td;
      tr.appendChild(td);
    }
    const actions = el('td', { 'data-field': 'actions' });
    for (const [a, label] of [['drain', 'Drain'], ['undrain', 'Undrain'], ['sleep', 'Sleep'], ['wake', 'Wake']]) {
      actions.appendChild(el('button', { type: 'button', 'data-action': a, 'aria-label': label + ' ' + name }, label));
    }
    tr.appendChild(actions);
    row = { tr, cells, state: '' };
    engineRows.set(name, row);
    return row;
  }

  async function pollEngines() {
    const headers = enginesETag ? { 'If-None-Match': enginesETag } : {};
    const resp = await api('/admin/console/engines', { headers });
    if (resp.status === 304) return;
    if (!resp.ok) throw new Error(await errorText(resp));
    enginesETag = resp.headers.get('ETag') || '';
    const data = await resp.json();
    const seen = new Set();
    const counts = {};
    let prev = null;
    for (const e of data.engines) {
      seen.add(e.name);
      counts[e.state] = (counts[e.state] || 0) + 1;
      const row = engineRow(e.name);
      const c = row.cells;
      setText(c.state, e.state);
      if (row.state !== e.state) {
        c.state.className = 'state-' + e.state;
        row.state = e.state;
      }
      setText(c.role, e.role);
      setText(c.tier, e.tier);
      setText(c.prefill, e.prefill);
      setText(c.decode, e.decode);
      setText(c.queue, e.queue === null ? '–' : e.queue);
      setText(c.kv, e.kv === null ? '–' : (e.kv * 100).toFixed(0) + '%');
      setText(c.ejections, e.ejections);
      setText(c.error, e.last_error);
      if (c.error.title !== e.last_error) c.error.title = e.last_error;
      // Keep the configured order; move a row only when it is out of place.
      const want = prev ? prev.nextSibling : engineBody.firstChild;
      if (want !== row.tr) engineBody.insertBefore(row.tr, want);
      prev = row.tr;
    }
    for (const [name, row] of engineRows) {
      if (!seen.has(name)) { row.tr.remove(); engineRows.delete(name); }
    }
    setText($('#engines-count'), '(' + data.engines.length + ')');
    const parts = Object.entries(counts).map(([k, v]) => v + ' ' + k);
    parts.push(data.requests_in_flight + ' requests in flight');
    setText($('#engines-summary'), parts.join(' · '));
  }

  const ENGINE_ACTIONS = { drain: 'drain', undrain: 'undrain', sleep: 'sleep?level=1', wake: 'wake_up' };
  engineBody.addEventListener('click', (ev) => {
    const b = ev.target.closest('button[data-action]');
    if (!b) return;
    const name = b.closest('tr').getAttribute('data-engine');
    const path = '/admin/engines/' + encodeURIComponent(name) + '/' + ENGINE_ACTIONS[b.getAttribute('data-action')];
    act(async () => {
      b.disabled = true;
      try {
        const resp = await api(path, { method: 'POST' });
        if (!resp.ok) throw new Error(name + ': ' + await errorText(resp));
        enginesETag = '';
        await pollEngines();
      } finally {
        b.disabled = false;
      }
    });
  });

  // ---- keys ----
  const keyRows = new Map();
  const keyBody = $('#keys-table tbody');
  const KEY_FIELDS = ['models', 'rpm', 'tpm', 'concurrent', 'in_flight', 'admitted', 'refused', 'tokens', 'spend', 'spend_limits'];

  function keyRow(name) {
    let row = keyRows.get(name);
    if (row) return row;
    const tr = el('tr', { 'data-key': name });
    tr.appendChild(el('td', { 'data-field': 'name' }, name));
    const cells = {};
    for (const f of KEY_FIELDS) {
      const td = el('td', { 'data-field': f });
      if (f !== 'models') td.classList.add('num');
      cells[f] = td;
      tr.appendChild(td);
    }
    const actions = el('td', { 'data-field': 'actions' });
    const revoke = el('button', { type: 'button', 'data-action': 'revoke', class: 'danger', 'aria-label': 'Revoke key ' + name }, 'Revoke');
    const confirm = el('button', { type: 'button', 'data-action': 'revoke-confirm', class: 'danger hidden', 'aria-label': 'Confirm revoking key ' + name }, 'Confirm revoke');
    const cancel = el('button', { type: 'button', 'data-action': 'revoke-cancel', class: 'hidden', 'aria-label': 'Keep key ' + name }, 'Cancel');
    actions.append(revoke, confirm, cancel);
    tr.appendChild(actions);
    row = { tr, cells };
    keyRows.set(name, row);
    return row;
  }

  const limit = (v) => (v ? String(v) : '∞');

  async function pollKeys() {
    const data = await apiJSON('/admin/keys');
    const seen = new Set();
    let prev = null;
    for (const k of data.keys || []) {
      seen.add(k.name);
      const row = keyRow(k.name);
      const c = row.cells;
      const l = k.limits || {};
      setText(c.models, (k.models || []).join(', '));
      setText(c.rpm, limit(l.requests_per_minute));
      setText(c.tpm, limit(l.tokens_per_minute));
      setText(c.concurrent, limit(l.concurrent));
      setText(c.in_flight, k.in_flight);
      setText(c.admitted, k.admitted);
      setText(c.refused, k.refused);
      setText(c.tokens, k.input_tokens + ' / ' + k.output_tokens);
      setText(c.spend, fmt(k.spend_usd, 4));
      setText(c.spend_limits, limit(l.max_spend_per_day) + ' / ' + limit(l.max_spend_per_month));
      const want = prev ? prev.nextSibling : keyBody.firstChild;
      if (want !== row.tr) keyBody.insertBefore(row.tr, want);
      prev = row.tr;
    }
    for (const [name, row] of keyRows) {
      if (!seen.has(name)) { row.tr.remove(); keyRows.delete(name); }
    }
  }

  keyBody.addEventListener('click', (ev) => {
    const b = ev.target.closest('button[data-action]');
    if (!b) return;
    const tr = b.closest('tr');
    const name = tr.getAttribute('data-key');
    const show = (confirming) => {
      $('button[data-action="revoke"]', tr).classList.toggle('hidden', confirming);
      $('button[data-action="revoke-confirm"]', tr).classList.toggle('hidden', !confirming);
      $('button[data-action="revoke-cancel"]', tr).classList.toggle('hidden', !confirming);
      // The clicked button is hidden: the focus goes to what replaced it.
      $(confirming ? 'button[data-action="revoke-confirm"]' : 'button[data-action="revoke"]', tr).focus();
    };
    switch (b.getAttribute('data-action')) {
      case 'revoke': show(true); return;
      case 'revoke-cancel': show(false); return;
      case 'revoke-confirm':
        act(async () => {
          const resp = await api('/admin/keys/' + encodeURIComponent(name), { method: 'DELETE' });
          if (!resp.ok && resp.status !== 404) {
            show(false); // back to Revoke: the key stays
            throw new Error(name + ': ' + await errorText(resp));
          }
          setText($('#keys-error'), '');
          await pollKeys();
          // The row and its focused button are gone: the focus goes to the
          // form that makes the next key, not to the page's start.
          $('#key-create input[name="name"]').focus();
        });
    }
  });

  $('#key-create').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const f = ev.target;
    const num = (n) => Number(f.elements[n].value || 0);
    const body = {
      name: f.elements.name.value.trim(),
      models: f.elements.models.value.split(',').map((s) => s.trim()).filter(Boolean),
      limits: {
        requests_per_minute: num('requests_per_minute'),
        tokens_per_minute: num('tokens_per_minute'),
        concurrent: num('concurrent'),
        max_spend_per_day: num('max_spend_per_day'),
        max_spend_per_month: num('max_spend_per_month'),
      },
    };
    if (body.models.length === 0) body.models = ['*'];
    act(async () => {
      const resp = await api('/admin/keys', {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
      });
      if (resp.status !== 201 && !resp.ok) {
        setText($('#keys-error'), await errorText(resp));
        return;
      }
      const created = await resp.json();
      setText($('#keys-error'), '');
      setText($('#key-secret'), created.key);
      $('#key-created').classList.remove('hidden');
      f.reset();
      await pollKeys();
    });
  });
  $('#key-secret-hide').addEventListener('click', () => {
    setText($('#key-secret'), '');
    $('#key-created').classList.add('hidden');
  });

  // ---- recent requests ----
  // A fixed set of rows, rewritten in place: a busy gateway replaces the
  // whole list every second, and new nodes each time would cost more.
  const reqRows = [];
  const reqBody = $('#requests-table tbody');
  const REQ_FIELDS = ['time', 'key', 'model', 'status', 'outcome', 'engines', 'ttft', 'duration', 'tokens', 'retries', 'continued', 'id'];
  const REQ_NUM = new Set(['status', 'ttft', 'duration', 'tokens', 'retries', 'continued']);

  function reqRow(i) {
    if (reqRows[i]) return reqRows[i];
    const tr = el('tr', { 'data-request': '' });
    const cells = REQ_FIELDS.map((f) => {
      const td = el('td', { 'data-field': f });
      if (REQ_NUM.has(f)) td.classList.add('num');
      tr.appendChild(td);
      return td;
    });
    reqRows[i] = { tr, cells, bad: false };
    return reqRows[i];
  }

  async function pollRequests() {
    const q = new URLSearchParams({ limit: '200' });
    const key = $('#filter-key').value.trim();
    const model = $('#filter-model').value.trim();
    if (key) q.set('key', key);
    if (model) q.set('model', model);
    const data = await apiJSON('/admin/console/requests?' + q.toString());
    data.requests.forEach((r, i) => {
      const row = reqRow(i);
      if (row.tr.getAttribute('data-request') !== r.id) row.tr.setAttribute('data-request', r.id);
      const tok = r.input_tokens === null ? '–' : r.input_tokens + ' / ' + r.output_tokens;
      const vals = [new Date(r.time).toLocaleTimeString(), r.key || '', r.model || '', r.status, r.outcome,
        (r.engines || []).join(', '), r.ttft_ms === null ? '–' : r.ttft_ms.toFixed(1), r.duration_ms.toFixed(1),
        tok, r.retries, r.continued, r.id];
      vals.forEach((v, j) => setText(row.cells[j], v));
      const bad = r.outcome !== 'ok';
      if (bad !== row.bad) { row.cells[4].classList.toggle('error', bad); row.bad = bad; }
      if (!row.tr.parentNode) reqBody.appendChild(row.tr);
    });
    for (let i = data.requests.length; i < reqRows.length; i++) {
      if (reqRows[i].tr.parentNode) reqRows[i].tr.remove();
    }
  }

  // ---- models (charts drawn on canvas) ----
  const charts = new Map();
  const CHARTS = [
    ['ttft', 'TTFT', ['ttft_p50', 'ttft_p99'], ms],
    ['itl', 'ITL', ['itl_p50', 'itl_p99'], ms],
    ['e2e', 'End to end', ['e2e_p50', 'e2e_p99'], ms],
    ['rate', 'Requests / errors per s', ['requests_per_second', 'errors_per_second'], (v) => fmt(v, 2)],
  ];
  const COLORS = ['#0969da', '#cf222e'];

  function chartBox(model, id, title, keys) {
    const k = model + '|' + id;
    let c = charts.get(k);
    if (c) return c;
    const box = el('div', { class: 'chart', 'data-model': model, 'data-chart': id });
    box.appendChild(el('h4', {}, model + ' · ' + title));
    const canvas = el('canvas', { width: '400', height: '120' });
    box.appendChild(canvas);
    const legend = el('div', { class: 'legend' });
    const spans = keys.map((key, i) => {
      const s = el('span', { class: i === 0 ? 'p50' : 'p99' });
      legend.appendChild(s);
      legend.appendChild(document.createTextNode(' '));
      return s;
    });
    box.appendChild(legend);
    $('#models-charts').appendChild(box);
    c = { box, canvas, spans };
    charts.set(k, c);
    return c;
  }

  function draw(canvas, t, series, label) {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(200, canvas.clientWidth || 400);
    const h = 120;
    if (canvas.width !== Math.round(w * dpr)) { canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr); }
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const pad = { l: 4, r: 4, t: 14, b: 14 };
    // The last 15 minutes, or since the first point when there is less.
    const now = Date.now();
    const first = t.length ? t[0] - 10000 : now;
    const t0 = Math.max(now - 15 * 60 * 1000, Math.min(first, now - 60 * 1000));
    const span = Math.round((now - t0) / 60000);
    let max = 0;
    for (const s of series) for (const v of s) if (v !== null && v > max) max = v;
    if (max <= 0) max = 1;
    max *= 1.1;
    const x = (ts) => pad.l + ((ts - t0) / (now - t0)) * (w - pad.l - pad.r);
    const y = (v) => h - pad.b - (v / max) * (h - pad.t - pad.b);
    ctx.strokeStyle = '#d8dee6';
    ctx.lineWidth = 1;
    ctx.beginPath();
    ctx.moveTo(pad.l, h - pad.b + 0.5);
    ctx.lineTo(w - pad.r, h - pad.b + 0.5);
    ctx.stroke();
    ctx.fillStyle = '#5f6b7a';
    ctx.font = '10px system-ui, sans-serif';
    ctx.fillText('max ' + label(max / 1.1), pad.l, 10);
    ctx.fillText('-' + span + ' min', pad.l, h - 2);
    ctx.fillText('now', w - pad.r - 18, h - 2);
    series.forEach((s, i) => {
      ctx.strokeStyle = COLORS[i];
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      let pen = false;
      for (let j = 0; j < s.length; j++) {
        if (s[j] === null || t[j] < t0) { pen = false; continue; }
        const px = x(t[j]);
        const py = y(s[j]);
        if (pen) ctx.lineTo(px, py); else ctx.moveTo(px, py);
        pen = true;
      }
      ctx.stroke();
    });
  }

  function lastValue(s) {
    for (let i = s.length - 1; i >= 0; i--) if (s[i] !== null) return s[i];
    return null;
  }

  async function pollModels() {
    const data = await apiJSON('/admin/console/models');
    for (const m of data.models) {
      for (const [id, title, keys, label] of CHARTS) {
        const c = chartBox(m.model, id, title, keys);
        const series = keys.map((k) => m[k]);
        draw(c.canvas, m.t, series, label);
        keys.forEach((k, i) => setText(c.spans[i], k.replace(/^.*_(p\d+)$/, '$1').replace('_per_second', '/s') + ' ' + label(lastValue(m[k]))));
      }
    }
    if (data.models.length === 0) setText($('#models-charts'), 'No model has been served yet.');
    else if ($('#models-charts').firstChild && $('#models-charts').firstChild.nodeType === Node.TEXT_NODE) $('#models-charts').firstChild.remove();
  }

  // ---- routing ----
  async function pollRouting() {
    const d = await apiJSON('/admin/console/routing');
    const dl = $('#routing-list');
    const rows = [['Policy', d.policy]];
    if (d.prefix_index) {
      rows.push(['Prefix index', d.prefix_index.entries + ' of ' + d.prefix_index.capacity + ' entries (' +
        (d.prefix_index.bytes / 1048576).toFixed(1) + ' MiB)']);
    }
    if (d.kv_index) {
      rows.push(['KV index', d.kv_index.blocks + ' blocks, ' + d.kv_index.engines + ' engines (' + d.kv_index.stale + ' stale)']);
    }
    rows.push(['Prefix cache hit rate', d.prefix_cache_hit_ratio === null ? '– (no engine reports one)'
      : (d.prefix_cache_hit_ratio * 100).toFixed(1) + '% (mean of ' + d.engines_reporting + (d.engines_reporting === 1 ? ' engine)' : ' engines)')]);
    dl.replaceChildren(...rows.flatMap(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]));
    $('#tiers-table tbody').replaceChildren(...(d.tiers || []).map((t) => {
      const tr = el('tr', { 'data-tier': String(t.tier) });
      [t.tier, (t.engines || []).length, t.legs, (t.share * 100).toFixed(1) + '%'].forEach((v) => tr.appendChild(el('td', {}, v)));
      return tr;
    }));
  }

  // ---- config ----
  async function pollConfig() {
    const d = await apiJSON('/admin/console/config');
    setText($('#config-json'), JSON.stringify(d.config, null, 2));
    $('#reloads-table tbody').replaceChildren(...d.reloads.map((r) => {
      const tr = el('tr', { 'data-reload': r.time });
      [new Date(r.time).toLocaleString(), r.outcome, r.changed.join(', ') || '–', r.restart.join(', ') || '–', r.error || '']
        .forEach((v, i) => {
          const td = el('td', {}, v);
          if (i === 1 && r.outcome !== 'ok') td.classList.add('error');
          tr.appendChild(td);
        });
      return tr;
    }));
  }

  let filterTimer = 0;
  const reqPoller = poller(pollRequests, FAST_MS);
  for (const id of ['#filter-key', '#filter-model']) {
    $(id).addEventListener('input', () => {
      clearTimeout(filterTimer);
      filterTimer = setTimeout(() => reqPoller.run(), 200);
    });
  }
  poller(pollEngines, FAST_MS);
  poller(pollKeys, FAST_MS);
  poller(pollModels, SLOW_MS);
  poller(pollRouting, SLOW_MS);
  poller(pollConfig, SLOW_MS);
  kick();
})();
