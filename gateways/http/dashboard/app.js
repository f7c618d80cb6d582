// rocketgate dashboard: a client of the admin API and /metrics (docs/dashboard.md).
// Plain JavaScript, no libraries, no build step; charts are hand-drawn SVG. Every
// value a user or a client chose (topic names, bodies, client ids) goes into the page
// as text nodes through h(), never as HTML.
'use strict';

// ---------- DOM helpers ----------

const $ = (sel, root = document) => root.querySelector(sel);
const SVGNS = 'http://www.w3.org/2000/svg';

/** An element with attributes (`on*` functions become listeners) and children. */
function h(tag, attrs, ...children) {
  const el = tag.startsWith('svg:') ? document.createElementNS(SVGNS, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'text') el.textContent = String(v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const enc = encodeURIComponent;
const fmtInt = (n) => (n === null || n === undefined ? '—' : Number(n).toLocaleString('en-US'));
const fmtRate = (n) => (n === null || n === undefined ? '—' : n === 0 ? '0' : n < 10 ? n.toFixed(1) : Math.round(n).toLocaleString('en-US'));
const fmtPct = (r) => (r === null || r === undefined ? '—' : (r * 100).toFixed(1) + ' %');
const fmtTime = (ms) => (ms ? new Date(ms).toISOString().replace('T', ' ').replace('Z', ' UTC') : '—');
function fmtDuration(ms) {
  if (ms === null || ms === undefined) return '—';
  const s = Math.floor(ms / 1000);
  const d = Math.floor(s / 86400), hh = Math.floor((s % 86400) / 3600), mm = Math.floor((s % 3600) / 60);
  return d ? `${d}d ${hh}h ${mm}m` : hh ? `${hh}h ${mm}m` : mm ? `${mm}m ${s % 60}s` : `${s}s`;
}

function banner(text, kind) {
  const b = $('#banner');
  b.textContent = text || '';
  b.className = kind || '';
  b.hidden = !text;
}

// ---------- the API, credentials, permissions ----------

const state = {
  auth: sessionStorage.getItem('rg-auth'),
  session: null, // {auth, user, admin, monitor} from GET /v1/session
  timers: [],
  page: null,
};

let loginPending = null;

/** Shows the sign-in dialog; resolves once the user submitted credentials. */
function login(why) {
  if (loginPending) return loginPending;
  loginPending = new Promise((resolve) => {
    const dlg = $('#login');
    $('#login-error').textContent = state.auth ? why || 'Those credentials were refused.' : '';
    const form = $('#login-form');
    const onKind = () => {
      const token = form.querySelector('input[name=kind]:checked').value === 'token';
      $('#login-token').hidden = !token;
      $('#login-password').hidden = token;
    };
    form.querySelectorAll('input[name=kind]').forEach((r) => (r.onchange = onKind));
    onKind();
    form.onsubmit = (ev) => {
      ev.preventDefault();
      const kind = form.querySelector('input[name=kind]:checked').value;
      if (kind === 'token') {
        state.auth = 'Bearer ' + $('#login-token-input').value.trim();
      } else {
        const raw = new TextEncoder().encode($('#login-user').value + ':' + $('#login-password-input').value);
        state.auth = 'Basic ' + btoa(String.fromCharCode(...raw));
      }
      sessionStorage.setItem('rg-auth', state.auth);
      state.session = null;
      dlg.close();
      loginPending = null;
      resolve();
    };
    if (!dlg.open) dlg.showModal();
  });
  return loginPending;
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** Calls the API: JSON in and out (text for /metrics); a 401 asks for credentials and retries. */
async function api(path, opts = {}) {
  for (;;) {
    const headers = {};
    if (state.auth) headers.authorization = state.auth;
    if (opts.body !== undefined) headers['content-type'] = 'application/json';
    const r = await fetch(path, {
      method: opts.method || 'GET',
      headers,
      body: opts.body !== undefined ? JSON.stringify(opts.body) : undefined,
      cache: 'no-store',
    });
    const text = await r.text();
    let data = text;
    if ((r.headers.get('content-type') || '').includes('json')) {
      try { data = text ? JSON.parse(text) : null; } catch { /* keep text */ }
    }
    if (r.status === 401) {
      await login(data && data.error ? data.error.message : 'Credentials required.');
      continue;
    }
    if (!r.ok) {
      const e = data && data.error ? data.error : { code: 'http_' + r.status, message: `HTTP ${r.status}` };
      throw new ApiError(r.status, e.code, e.message);
    }
    return data;
  }
}

/** True when the endpoint does not exist in this build (another helper's endpoint not merged). */
const missing = (e) => e instanceof ApiError && e.status === 404 && e.code === 'no_route';

/** Who is signed in and what they may do. */
async function session() {
  if (state.session) return state.session;
  try {
    state.session = await api('/v1/session');
  } catch (e) {
    // Older builds have no /v1/session: the API itself still refuses what is not allowed.
    state.session = { auth: !!state.auth, user: null, admin: true, monitor: true };
  }
  const who = $('#who');
  who.replaceChildren();
  if (state.session.auth) {
    who.append(
      h('span', { id: 'who-user' }, state.session.user || '?'),
      ' ',
      h('span', { class: 'pill', id: 'who-role' }, state.session.admin ? 'admin' : 'read-only'),
      h('button', { class: 'secondary', id: 'sign-out', onclick: signOut }, 'Sign out'),
    );
  }
  return state.session;
}

function signOut() {
  sessionStorage.removeItem('rg-auth');
  state.auth = null;
  state.session = null;
  location.reload();
}

/** May the user change things (resend, kick)? The server checks again. */
const mayWrite = () => !state.session || state.session.admin !== false;

/** A button for a change: disabled with a note for read-only users. */
function writeButton(label, attrs, onclick) {
  const ro = !mayWrite();
  return h('button', { ...attrs, disabled: ro, title: ro ? 'read-only: needs the admin permission' : null, onclick }, label);
}

// ---------- Prometheus text format ----------

/** Parses the Prometheus text exposition format into families of samples. */
function parseMetrics(text) {
  const families = new Map();
  const family = (name) => {
    if (!families.has(name)) families.set(name, { name, type: 'untyped', help: '', samples: [] });
    return families.get(name);
  };
  for (const line of String(text).split('\n')) {
    if (!line.trim()) continue;
    let m;
    if ((m = /^# (HELP|TYPE) (\S+) ?(.*)$/.exec(line))) {
      const f = family(m[2]);
      if (m[1] === 'HELP') f.help = m[3];
      else f.type = m[3];
      continue;
    }
    if (line.startsWith('#')) continue;
    m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
    let l;
    while ((l = re.exec(m[2] || ''))) labels[l[1]] = l[2].replace(/\\n/g, '\n').replace(/\\(.)/g, '$1');
    const value = m[3] === '+Inf' ? Infinity : m[3] === '-Inf' ? -Infinity : Number(m[3]);
    let base = m[1];
    const suffix = /^(.*)_(bucket|sum|count)$/.exec(base);
    if (suffix && families.has(suffix[1]) && families.get(suffix[1]).type !== 'untyped') base = suffix[1];
    family(base).samples.push({ name: m[1], labels, value });
  }
  return families;
}

/** Sum of the samples named `name` whose labels include `match`. */
function msum(families, name, match = {}) {
  let total = 0;
  for (const f of families.values()) {
    for (const s of f.samples) {
      if (s.name !== name) continue;
      if (Object.entries(match).every(([k, v]) => s.labels[k] === v)) total += s.value;
    }
  }
  return total;
}

/** Values of `label` among samples named `name`. */
function mlabels(families, name, label) {
  const out = new Set();
  for (const f of families.values()) for (const s of f.samples) if (s.name === name && s.labels[label] !== undefined) out.add(s.labels[label]);
  return [...out].sort();
}

// Counters between two scrapes -> per-second rates. Kept across pages.
const rates = { prev: null, series: { in: [], out: [], disk: [], conns: [], lag: [] }, topicPrev: null, topicRates: {} };
const HISTORY = 60;

async function scrape() {
  const fams = parseMetrics(await api('/metrics'));
  const now = performance.now();
  const cur = { t: now, in: msum(fams, 'rocketgate_messages_in_total'), out: msum(fams, 'rocketgate_messages_out_total') };
  const push = (k, v) => { rates.series[k].push(v); if (rates.series[k].length > HISTORY) rates.series[k].shift(); };
  if (rates.prev && now > rates.prev.t) {
    const dt = (now - rates.prev.t) / 1000;
    push('in', Math.max(0, (cur.in - rates.prev.in) / dt));
    push('out', Math.max(0, (cur.out - rates.prev.out) / dt));
  }
  push('disk', msum(fams, 'rocketgate_disk_usage_ratio') * 100);
  push('conns', msum(fams, 'rocketgate_connections'));
  push('lag', msum(fams, 'rocketgate_consumer_lag'));
  // Per-topic publish rates.
  const byTopic = {};
  for (const t of mlabels(fams, 'rocketgate_messages_in_total', 'topic')) byTopic[t] = msum(fams, 'rocketgate_messages_in_total', { topic: t });
  if (rates.topicPrev && now > rates.topicPrev.t) {
    const dt = (now - rates.topicPrev.t) / 1000;
    for (const [t, v] of Object.entries(byTopic)) rates.topicRates[t] = Math.max(0, (v - (rates.topicPrev.v[t] || 0)) / dt);
  }
  rates.topicPrev = { t: now, v: byTopic };
  rates.prev = cur;
  return fams;
}

// ---------- charts (SVG) ----------

const W = 400, H = 150, PAD_L = 44, PAD_B = 16, PAD_T = 8;

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function axes(svg, max, fmt) {
  for (const frac of [0, 0.5, 1]) {
    const y = PAD_T + (H - PAD_T - PAD_B) * (1 - frac);
    svg.append(h('svg:line', { class: 'grid', x1: PAD_L, x2: W, y1: y, y2: y }));
    svg.append(h('svg:text', { class: 'axis', x: PAD_L - 4, y: y + 3, 'text-anchor': 'end' }, fmt(max * frac)));
  }
}

/** A line chart of `series` (arrays of numbers, newest last) over the last HISTORY points. */
function lineChart(series, opts = {}) {
  const svg = h('svg:svg', { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img' });
  const all = series.flat().filter(Number.isFinite);
  const max = opts.max || niceMax(Math.max(0, ...all));
  const fmt = opts.fmt || ((v) => fmtRate(v));
  axes(svg, max, fmt);
  const x = (i, n) => W - ((n - 1 - i) * (W - PAD_L)) / (HISTORY - 1);
  const y = (v) => PAD_T + (H - PAD_T - PAD_B) * (1 - Math.min(v, max) / max);
  series.forEach((vals, k) => {
    if (vals.length < 1) return;
    const pts = vals.map((v, i) => `${x(i, vals.length).toFixed(1)},${y(v).toFixed(1)}`);
    if (k === 0 && vals.length > 1) {
      svg.append(h('svg:polygon', { class: 'area', points: `${x(0, vals.length)},${H - PAD_B} ${pts.join(' ')} ${W},${H - PAD_B}` }));
    }
    if (vals.length > 1) svg.append(h('svg:polyline', { class: `line l${k}`, points: pts.join(' ') }));
    else svg.append(h('svg:circle', { class: `dot l${k}`, cx: W - 3, cy: y(vals[0]), r: 3 }));
  });
  return svg;
}

/** A bar chart of `{label, value}` items. */
function barChart(items, opts = {}) {
  const svg = h('svg:svg', { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img' });
  const max = niceMax(Math.max(0, ...items.map((i) => i.value)));
  axes(svg, max, (v) => fmtInt(Math.round(v)));
  const n = Math.max(items.length, 1);
  const slot = (W - PAD_L) / n;
  const bw = Math.max(2, Math.min(40, slot * 0.7));
  items.forEach((it, i) => {
    const bh = ((H - PAD_T - PAD_B) * it.value) / max;
    const x = PAD_L + slot * i + (slot - bw) / 2;
    svg.append(h('svg:rect', { class: 'bar' + (opts.hot && opts.hot(it) ? ' hot' : ''), x, y: H - PAD_B - bh, width: bw, height: Math.max(bh, 0) }, h('svg:title', {}, `${it.label}: ${fmtInt(it.value)}`)));
    if (n <= 24) svg.append(h('svg:text', { class: 'axis', x: x + bw / 2, y: H - 3, 'text-anchor': 'middle' }, it.label));
  });
  return svg;
}

function chartBox(title, id, svg, now, legend) {
  return h('div', { class: 'chart', id },
    h('h3', {}, title, h('span', { class: 'now' }, now)),
    legend ? h('div', { class: 'legend' }, legend.map((l, k) => h('span', { class: 'k' + k }, l))) : null,
    svg);
}

// ---------- tables ----------

function cellText(v) {
  if (v === null || v === undefined) return '—';
  if (Array.isArray(v)) return v.every((x) => typeof x !== 'object' || x === null) ? v.join(', ') : JSON.stringify(v);
  if (typeof v === 'object') return JSON.stringify(v);
  return String(v);
}

/**
 * A table. `cols`: [{key, label, num, fmt(v,row), attr}] or omitted (every key of
 * the rows). `opts.row(row)`: extra attributes of a row; `opts.extra(row)`: a last cell.
 */
function table(rows, cols, opts = {}) {
  if (!cols) {
    const keys = [];
    for (const r of rows) for (const k of Object.keys(r)) if (!keys.includes(k)) keys.push(k);
    cols = keys.map((k) => ({ key: k, label: k.replace(/_/g, ' '), fmt: /_ms$/.test(k) ? (v) => (v > 1e12 ? fmtTime(v) : cellText(v)) : null }));
  }
  const head = h('tr', {}, cols.map((c) => h('th', { class: c.num ? 'num' : null }, c.label)), opts.extra ? h('th', {}, opts.extraLabel || '') : null);
  const body = rows.map((r) => h('tr', opts.row ? opts.row(r) : {},
    cols.map((c) => h('td', { class: c.num ? 'num' : null, 'data-k': c.key }, c.fmt ? c.fmt(r[c.key], r) : cellText(r[c.key]))),
    opts.extra ? h('td', {}, opts.extra(r)) : null));
  return h('table', { id: opts.id }, h('thead', {}, head), h('tbody', {}, rows.length ? body : h('tr', {}, h('td', { colspan: cols.length + (opts.extra ? 1 : 0), class: 'muted' }, opts.empty || 'none'))));
}

function card(label, value, key) {
  return h('div', { class: 'card', 'data-card': key }, h('div', { class: 'label' }, label), h('div', { class: 'value', 'data-k': key }, value));
}

function notAvailable(what, path) {
  return h('p', { class: 'muted not-available' }, `${what}: this build has no ${path} endpoint yet.`);
}

// ---------- pages ----------

/** Runs `fn` now and every `ms` while the page is shown. */
function every(ms, fn) {
  let busy = false;
  const tick = async () => {
    if (busy) return;
    busy = true;
    try { await fn(); } catch (e) { banner(e.message); } finally { busy = false; }
  };
  tick();
  state.timers.push(setInterval(tick, ms));
}

function mount(...nodes) {
  $('#main').replaceChildren(...nodes);
}

const pages = {};

pages.overview = async () => {
  const cards = h('div', { class: 'cards', id: 'overview-cards' });
  const charts = h('div', { class: 'charts', id: 'overview-charts' });
  const nodes = h('div', { id: 'overview-nodes' });
  const repl = h('div', { id: 'overview-replication' });
  const ready = h('div', { id: 'overview-readiness' });
  mount(h('h1', {}, 'Overview'), cards, charts, h('div', { class: 'split' }, h('div', {}, h('h2', {}, 'Nodes'), nodes, h('h2', {}, 'Replication'), repl), h('div', {}, h('h2', {}, 'Readiness'), ready)));
  let n = 0;
  every(1000, async () => {
    const [broker, fams] = await Promise.all([api('/v1/broker'), scrape()]);
    const s = broker.store || {};
    const r = broker.replication;
    cards.replaceChildren(
      card('Broker', broker.broker_name, 'broker_name'),
      card('Cluster', broker.cluster, 'cluster'),
      card('Role', r ? r.role : 'standalone', 'role'),
      card('Version', broker.version, 'version'),
      card('Uptime', fmtDuration(broker.uptime_ms), 'uptime'),
      card('User topics', fmtInt(broker.user_topics), 'user_topics'),
      card('Disk usage', fmtPct(s.disk_usage), 'disk_usage'),
      card('Commit log written', fmtInt(s.log_written) + ' B', 'log_written'),
      card('Connections', fmtInt(msum(fams, 'rocketgate_connections')), 'connections'),
      card('Messages in', fmtInt(msum(fams, 'rocketgate_messages_in_total')), 'messages_in'),
      card('Messages out', fmtInt(msum(fams, 'rocketgate_messages_out_total')), 'messages_out'),
      card('Consumer lag', fmtInt(msum(fams, 'rocketgate_consumer_lag')), 'consumer_lag'),
    );
    const S = rates.series;
    const last = (a) => (a.length ? a[a.length - 1] : null);
    charts.replaceChildren(
      chartBox('Messages per second', 'chart-rates', lineChart([S.in, S.out]), `in ${fmtRate(last(S.in))} · out ${fmtRate(last(S.out))}`, ['in', 'out']),
      chartBox('Disk usage', 'chart-disk', lineChart([S.disk], { max: 100, fmt: (v) => v.toFixed(0) + '%' }), `${fmtRate(last(S.disk))} % (refused above ${fmtPct(s.disk_hard_ratio)})`),
      chartBox('Connections (all doors)', 'chart-conns', lineChart([S.conns], { fmt: (v) => fmtInt(Math.round(v)) }), fmtInt(last(S.conns))),
      chartBox('Consumer lag (all groups)', 'chart-lag', lineChart([S.lag], { fmt: (v) => fmtInt(Math.round(v)) }), fmtInt(last(S.lag))),
    );
    if (n++ % 5 === 0) {
      try {
        // 503 with the same JSON when not ready: read it either way.
        const r = await fetch('/readyz', { cache: 'no-store' });
        const body = r.status === 404 ? null : await r.json();
        ready.replaceChildren(body
          ? h('div', {},
            h('p', {}, h('span', { class: 'pill ' + (r.ok ? 'master' : 'bad'), id: 'ready-state' }, r.ok ? 'ready' : 'not ready')),
            table(body.checks || [], [
              { key: 'name', label: 'check' },
              { key: 'ok', label: '', fmt: (v) => h('span', { class: 'pill ' + (v ? 'master' : 'bad') }, v ? 'ok' : 'no') },
              { key: 'detail', label: 'detail' },
            ], { id: 'readiness-table' }))
          : notAvailable('Readiness', 'GET /readyz'));
      } catch (e) {
        ready.replaceChildren(h('p', { class: 'error' }, e.message));
      }
      try {
        const c = await api('/v1/cluster');
        const rows = [];
        for (const b of c.brokers || []) {
          for (const [id, addr] of Object.entries(b.addrs || {})) {
            rows.push({ broker_name: b.broker_name, cluster: b.cluster, broker_id: Number(id), role: Number(id) === 0 ? 'master' : 'slave', addr });
          }
        }
        nodes.replaceChildren(
          h('p', { class: 'muted' }, `As NameServer ${c.namesrv || '?'} knows them.`),
          table(rows, [
            { key: 'broker_name', label: 'broker' }, { key: 'cluster', label: 'cluster' },
            { key: 'broker_id', label: 'id', num: true },
            { key: 'role', label: 'role', fmt: (v) => h('span', { class: 'pill ' + v }, v) },
            { key: 'addr', label: 'address', fmt: (v) => h('code', {}, v) },
          ], { id: 'nodes-table' }),
        );
      } catch (e) {
        nodes.replaceChildren(h('p', { class: 'error' }, `Cluster view unavailable: ${e.message}`));
      }
    }
    if (!r) {
      repl.replaceChildren(h('p', { class: 'muted' }, 'This node does not replicate.'));
    } else {
      const facts = [['role', r.role], ['broker id', r.broker_id], ['mode', r.mode], ['min in-sync replicas', r.min_in_sync_replicas], ['confirmed offset', r.confirmed_offset], ['master', r.master], ['connected', r.connected], ['lag (bytes)', r.lag_bytes]]
        .filter(([, v]) => v !== undefined);
      repl.replaceChildren(
        table(facts.map(([k, v]) => ({ k, v })), [{ key: 'k', label: 'this node' }, { key: 'v', label: '' }], { id: 'replication-facts' }),
        r.role === 'master'
          ? table(r.slaves || [], [
            { key: 'broker_id', label: 'slave', num: true }, { key: 'addr', label: 'address' },
            { key: 'offset', label: 'offset', num: true, fmt: fmtInt }, { key: 'lag_bytes', label: 'lag (bytes)', num: true, fmt: fmtInt },
            { key: 'lag_ms', label: 'behind for', num: true, fmt: (v) => fmtDuration(v) },
            { key: 'in_sync', label: 'in sync', fmt: (v) => h('span', { class: 'pill ' + (v ? 'master' : 'bad') }, v ? 'yes' : 'no') },
          ], { id: 'slaves-table', empty: 'no slaves connected', row: (sl) => ({ 'data-slave': sl.broker_id }) })
          : null,
      );
    }
  });
};

async function describeTopics(kind) {
  const list = (await api('/v1/topics?kind=' + kind)).topics || [];
  const described = await Promise.all(list.slice(0, 300).map((t) => api('/v1/topics/' + enc(t.name)).catch(() => t)));
  return described.map((t) => {
    const qs = t.queues || [];
    return {
      ...t,
      messages: qs.reduce((a, q) => a + (q.max_offset - q.min_offset), 0),
      last_store_ms: qs.reduce((a, q) => Math.max(a, q.last_store_ms || 0), 0) || null,
    };
  });
}

pages.topics = async (arg) => {
  if (arg) return topicDetail(arg);
  const showSystem = h('input', { type: 'checkbox', id: 'show-system' });
  const box = h('div', { id: 'topics' });
  mount(h('h1', {}, 'Topics'), h('div', { class: 'toolbar' }, h('label', { class: 'inline' }, h('span', {}, showSystem, ' show system topics'))), box);
  const draw = async () => {
    const [topics] = await Promise.all([describeTopics(showSystem.checked ? 'all' : 'user'), scrape()]);
    box.replaceChildren(table(topics, [
      { key: 'name', label: 'topic', fmt: (v) => h('a', { href: '#/topics/' + enc(v) }, v) },
      { key: 'perm', label: 'perm' },
      { key: 'read_queues', label: 'read queues', num: true }, { key: 'write_queues', label: 'write queues', num: true },
      { key: 'messages', label: 'messages stored', num: true, fmt: fmtInt },
      { key: 'rate', label: 'in msg/s', num: true, fmt: (_, r) => fmtRate(rates.topicRates[r.name] || 0) },
      { key: 'last_store_ms', label: 'last stored', fmt: fmtTime },
    ], { id: 'topics-table', row: (r) => ({ 'data-topic': r.name }) }));
  };
  showSystem.onchange = draw;
  every(3000, draw);
};

async function topicDetail(name) {
  const box = h('div', {});
  mount(h('h1', {}, h('a', { href: '#/topics' }, 'Topics'), ' / ', name), box);
  every(3000, async () => {
    const t = await api('/v1/topics/' + enc(name));
    const qs = (t.queues || []).map((q) => ({ ...q, messages: q.max_offset - q.min_offset }));
    box.replaceChildren(
      h('div', { class: 'cards' }, card('Permission', t.perm, 'perm'), card('Read queues', t.read_queues, 'read_queues'), card('Write queues', t.write_queues, 'write_queues'), card('Messages stored', fmtInt(qs.reduce((a, q) => a + q.messages, 0)), 'messages')),
      h('div', { class: 'split' },
        table(qs, [
          { key: 'queue_id', label: 'queue', num: true }, { key: 'min_offset', label: 'min offset', num: true, fmt: fmtInt },
          { key: 'max_offset', label: 'max offset', num: true, fmt: fmtInt }, { key: 'messages', label: 'messages', num: true, fmt: fmtInt },
          { key: 'last_store_ms', label: 'last stored', fmt: fmtTime },
        ], { id: 'queues-table', row: (q) => ({ 'data-queue': q.queue_id }) }),
        chartBox('Messages per queue', 'chart-queues', barChart(qs.map((q) => ({ label: String(q.queue_id), value: q.messages }))), '')),
    );
  });
}

async function describeGroup(g) {
  const d = await api('/v1/groups/' + enc(g));
  return { ...d, members_count: (d.members || []).length, topics: [...new Set((d.progress || []).map((p) => p.topic))] };
}

pages.groups = async (arg) => {
  if (arg) return groupDetail(arg);
  const box = h('div', { id: 'groups' });
  mount(h('h1', {}, 'Consumer groups'), box);
  every(3000, async () => {
    const names = (await api('/v1/groups')).groups || [];
    const groups = await Promise.all(names.slice(0, 300).map(describeGroup));
    box.replaceChildren(
      table(groups, [
        { key: 'group', label: 'group', fmt: (v) => h('a', { href: '#/groups/' + enc(v) }, v) },
        { key: 'topics', label: 'topics' },
        { key: 'lag', label: 'lag', num: true, fmt: fmtInt },
        { key: 'members_count', label: 'members', num: true },
        { key: 'fifo', label: 'ordering', fmt: (v) => (v ? 'FIFO' : 'concurrent') },
        { key: 'max_reconsume_times', label: 'max reconsume', num: true },
      ], { id: 'groups-table', row: (r) => ({ 'data-group': r.group }) }),
      groups.length ? chartBox('Lag per group', 'chart-group-lag', barChart(groups.map((g) => ({ label: g.group, value: g.lag || 0 }))), '') : null,
    );
  });
};

async function groupDetail(g) {
  const cards = h('div', { class: 'cards' });
  const body = h('div', {});
  const conns = h('div', { id: 'group-connections' });
  const lagHistory = [];
  mount(h('h1', {}, h('a', { href: '#/groups' }, 'Groups'), ' / ', g), cards, body, h('h2', {}, 'Members and connections'), conns);
  let n = 0;
  every(2000, async () => {
    const d = await describeGroup(g);
    lagHistory.push(d.lag || 0);
    if (lagHistory.length > HISTORY) lagHistory.shift();
    const progress = d.progress || [];
    cards.replaceChildren(card('Lag', fmtInt(d.lag), 'lag'), card('Topics', d.topics.length, 'topics'), card('Members', d.members_count, 'members'), card('Ordering', d.fifo ? 'FIFO' : 'concurrent', 'ordering'), card('Max reconsume', d.max_reconsume_times, 'max_reconsume_times'));
    body.replaceChildren(
      h('div', { class: 'charts' },
        chartBox('Lag per queue', 'chart-queue-lag', barChart(progress.map((p) => ({ label: `${p.topic}:${p.queue_id}`, value: p.lag || 0 })), { hot: (it) => it.value > 0 }), ''),
        chartBox('Total lag', 'chart-lag-history', lineChart([lagHistory], { fmt: (v) => fmtInt(Math.round(v)) }), fmtInt(d.lag))),
      table(progress, [
        { key: 'topic', label: 'topic' }, { key: 'queue_id', label: 'queue', num: true },
        { key: 'committed', label: 'consumer offset', num: true, fmt: fmtInt }, { key: 'max_offset', label: 'broker offset', num: true, fmt: fmtInt },
        { key: 'lag', label: 'lag', num: true, fmt: fmtInt },
      ], { id: 'progress-table', row: (p) => ({ 'data-queue': `${p.topic}:${p.queue_id}` }) }),
    );
    if (n++ % 3 === 0) {
      const parts = [h('h3', {}, 'Members (native and MQTT consumers)'), table(d.members || [], null, { id: 'members-table', empty: 'no live members (HTTP consumers are stateless)' })];
      try {
        const c = await api('/v1/groups/' + enc(g) + '/connections');
        const rows = Array.isArray(c) ? c : c.connections || [];
        parts.push(h('h3', {}, 'Connections across doors'), table(rows, null, { id: 'connections-table', empty: 'none' }));
      } catch (e) {
        if (!missing(e)) throw e;
        parts.push(notAvailable('Connections across doors', 'GET /v1/groups/{group}/connections'));
      }
      conns.replaceChildren(...parts);
    }
  });
}

// ----- message search -----

function bodyBytes(m) {
  if (m.body_encoding === 'base64') return Uint8Array.from(atob(m.body || ''), (c) => c.charCodeAt(0));
  return new TextEncoder().encode(m.body || '');
}

function hexdump(bytes) {
  const lines = [];
  for (let i = 0; i < bytes.length; i += 16) {
    const row = bytes.slice(i, i + 16);
    const hex = [...row].map((b) => b.toString(16).padStart(2, '0')).join(' ');
    const ascii = [...row].map((b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : '.')).join('');
    lines.push(`${i.toString(16).padStart(8, '0')}  ${hex.padEnd(47)}  ${ascii}`);
  }
  return lines.join('\n') || '(empty)';
}

async function deliveries(m) {
  const names = ((await api('/v1/groups')).groups || []).slice(0, 100);
  const out = [];
  for (const g of await Promise.all(names.map((n) => api('/v1/groups/' + enc(n)).catch(() => null)))) {
    if (!g) continue;
    const p = (g.progress || []).find((p) => p.topic === m.topic && p.queue_id === m.queue_id);
    if (!p) continue;
    const done = p.committed !== null && p.committed !== undefined && p.committed > m.queue_offset;
    out.push({ group: g.group, status: done ? 'consumed' : 'not yet', consumer_offset: p.committed });
  }
  return out;
}

function messageDetail(m) {
  const bytes = bodyBytes(m);
  const pre = h('pre', { id: 'message-body' });
  const show = (mode) => {
    pre.textContent = mode === 'hex' ? hexdump(bytes) : new TextDecoder('utf-8').decode(bytes);
    pre.dataset.mode = mode;
  };
  show(m.body_encoding === 'base64' ? 'hex' : 'text');
  const fields = ['msg_id', 'topic', 'queue_id', 'queue_offset', 'tag', 'keys', 'born_host', 'born_timestamp', 'store_timestamp', 'reconsume_times'];
  const deliveredBox = h('div', { id: 'message-deliveries' }, h('p', { class: 'muted' }, 'Looking at the groups…'));
  deliveries(m).then((rows) => deliveredBox.replaceChildren(table(rows, [
    { key: 'group', label: 'group' }, { key: 'status', label: 'status' }, { key: 'consumer_offset', label: 'consumer offset', num: true, fmt: fmtInt },
  ], { id: 'deliveries-table', empty: 'no group consumes this topic' })), (e) => deliveredBox.replaceChildren(h('p', { class: 'error' }, e.message)));
  return h('div', { class: 'detail', id: 'message-detail' },
    h('h2', {}, 'Message ', h('code', {}, m.msg_id)),
    h('div', { class: 'split' }, h('div', {},
    table(fields.map((k) => ({ field: k, value: k.endsWith('timestamp') ? `${fmtTime(m[k])} (${m[k]})` : m[k] })), [{ key: 'field', label: 'field' }, { key: 'value', label: 'value' }], { id: 'message-fields' }),
    h('h3', {}, 'Delivered to (consumer groups of the topic)'),
    deliveredBox), h('div', {},
    h('h3', {}, 'Properties'),
    table(Object.entries(m.properties || {}).map(([k, v]) => ({ name: k, value: v })), [{ key: 'name', label: 'name' }, { key: 'value', label: 'value' }], { id: 'message-properties', empty: 'no properties' }),
    h('h3', {}, `Body (${bytes.length} bytes) `,
      h('button', { class: 'secondary', id: 'body-text', onclick: () => show('text') }, 'Text'), ' ',
      h('button', { class: 'secondary', id: 'body-hex', onclick: () => show('hex') }, 'Hex')),
    pre)));
}

pages.messages = async () => {
  const mode = h('select', { id: 'search-mode' }, h('option', { value: 'id' }, 'by message id'), h('option', { value: 'key' }, 'by key'), h('option', { value: 'time' }, 'by time range'));
  const id = h('input', { id: 'search-id', size: 34, placeholder: 'message id' });
  const topic = h('input', { id: 'search-topic', placeholder: 'topic' });
  const key = h('input', { id: 'search-key', placeholder: 'key' });
  const hourAgo = new Date(Date.now() - 3600e3);
  const local = (d) => new Date(d.getTime() - d.getTimezoneOffset() * 60e3).toISOString().slice(0, 16);
  const begin = h('input', { id: 'search-begin', type: 'datetime-local', value: local(hourAgo) });
  const end = h('input', { id: 'search-end', type: 'datetime-local', value: local(new Date(Date.now() + 3600e3)) });
  const fields = {
    id: () => [h('label', {}, 'Message id', id)],
    key: () => [h('label', {}, 'Topic', topic), h('label', {}, 'Key', key)],
    time: () => [h('label', {}, 'Topic', topic), h('label', {}, 'Stored from', begin), h('label', {}, 'to', end)],
  };
  const inputs = h('span', { class: 'toolbar' });
  const results = h('div', { id: 'search-results' });
  const detail = h('div', {});
  const setMode = () => inputs.replaceChildren(...fields[mode.value]());
  mode.onchange = setMode;
  setMode();
  const form = h('form', { class: 'inline', id: 'search-form' }, h('label', {}, 'Find', mode), inputs, h('button', { type: 'submit', id: 'search-go' }, 'Search'));
  form.onsubmit = async (ev) => {
    ev.preventDefault();
    banner('');
    detail.replaceChildren();
    try {
      let msgs;
      if (mode.value === 'id') {
        msgs = [await api('/v1/messages/' + enc(id.value.trim()))];
      } else if (mode.value === 'key') {
        msgs = (await api(`/v1/topics/${enc(topic.value.trim())}/messages?key=${enc(key.value.trim())}`)).messages;
      } else {
        const b = new Date(begin.value).getTime(), e = new Date(end.value).getTime();
        msgs = (await api(`/v1/topics/${enc(topic.value.trim())}/messages?begin_ms=${b}&end_ms=${e}`)).messages;
      }
      results.replaceChildren(h('p', { class: 'muted', id: 'search-count' }, `${msgs.length} message${msgs.length === 1 ? '' : 's'}`), table(msgs, [
        { key: 'msg_id', label: 'id', fmt: (v) => h('code', {}, v) }, { key: 'topic', label: 'topic' }, { key: 'queue_id', label: 'queue', num: true },
        { key: 'queue_offset', label: 'offset', num: true }, { key: 'tag', label: 'tag' }, { key: 'keys', label: 'keys' },
        { key: 'store_timestamp', label: 'stored', fmt: fmtTime },
      ], {
        id: 'search-table',
        empty: 'nothing found',
        row: (m) => ({ class: 'click', 'data-msg': m.msg_id, onclick: (ev) => { results.querySelectorAll('tr.selected').forEach((r) => r.classList.remove('selected')); ev.currentTarget.classList.add('selected'); detail.replaceChildren(messageDetail(m)); } }),
      }));
      if (msgs.length === 1) detail.replaceChildren(messageDetail(msgs[0]));
    } catch (e) {
      results.replaceChildren(h('p', { class: 'error', id: 'search-error' }, e.message));
    }
  };
  mount(h('h1', {}, 'Find messages'), form, results, detail);
};

// ----- dead letters -----

pages.dlq = async (arg) => {
  const list = h('div', { id: 'dlq-groups' });
  const box = h('div', { id: 'dlq-box' });
  mount(h('h1', {}, 'Dead letters'), list, box);
  const system = await describeTopics('all');
  const dlqs = system.filter((t) => t.name.startsWith('%DLQ%')).map((t) => ({ group: t.name.slice(5), messages: t.messages, last_store_ms: t.last_store_ms }));
  list.replaceChildren(table(dlqs, [
    { key: 'group', label: 'group', fmt: (v) => h('a', { href: '#/dlq/' + enc(v) }, v) },
    { key: 'messages', label: 'dead letters', num: true, fmt: fmtInt },
    { key: 'last_store_ms', label: 'last', fmt: fmtTime },
  ], { id: 'dlq-groups-table', empty: 'no group has dead letters', row: (r) => ({ 'data-group': r.group }) }));
  if (!arg) return;
  const group = arg;
  const draw = async () => {
    let page = await api(`/v1/groups/${enc(group)}/dlq?offset=0&max=32`);
    if (page.status === 'offset_moved') page = await api(`/v1/groups/${enc(group)}/dlq?offset=${page.next_offset}&max=32`);
    const msgs = page.messages || [];
    const resend = async (body, label) => {
      try {
        const r = await api(`/v1/groups/${enc(group)}/dlq/resend`, { method: 'POST', body });
        const where = (r.resent || []).map((x) => `${x.topic} queue ${x.queue_id} offset ${x.queue_offset}`).join('; ');
        banner(`Re-sent ${(r.resent || []).length} ${label}: ${where || 'nothing to re-send'}`, 'info');
        await draw();
      } catch (e) {
        banner(`Re-send refused: ${e.message}`);
      }
    };
    box.replaceChildren(
      h('h2', {}, `Group ${group}`),
      h('div', { class: 'toolbar' }, writeButton('Re-send all', { id: 'dlq-resend-all', class: 'danger' }, () => resend({ all: true }, 'dead letters')),
        mayWrite() ? null : h('span', { class: 'readonly-note' }, 'read-only: re-sending needs the admin permission')),
      table(msgs, [
        { key: 'queue_offset', label: 'offset', num: true }, { key: 'msg_id', label: 'id', fmt: (v) => h('code', {}, v) },
        { key: 'origin', label: 'original topic', fmt: (_, m) => (m.properties || {}).RETRY_TOPIC || (m.properties || {}).REAL_TOPIC || m.topic },
        { key: 'tag', label: 'tag' }, { key: 'reconsume_times', label: 'deliveries failed', num: true },
        { key: 'store_timestamp', label: 'dead since', fmt: fmtTime },
        { key: 'body', label: 'body', fmt: (_, m) => { const t = new TextDecoder().decode(bodyBytes(m)); return t.length > 60 ? t.slice(0, 60) + '…' : t; } },
      ], {
        id: 'dlq-table', empty: 'no dead letters',
        row: (m) => ({ 'data-offset': m.queue_offset }),
        extra: (m) => writeButton('Re-send', { class: 'resend', 'data-offset': m.queue_offset }, () => resend({ offset: m.queue_offset }, `offset ${m.queue_offset}`)),
      }),
    );
  };
  await draw();
};

// ----- MQTT -----

pages.mqtt = async () => {
  const cards = h('div', { class: 'cards', id: 'mqtt-cards' });
  const box = h('div', { id: 'mqtt-sessions' });
  mount(h('h1', {}, 'MQTT clients and sessions'), cards, box);
  every(3000, async () => {
    const fams = await scrape();
    cards.replaceChildren(
      card('MQTT connections', fmtInt(msum(fams, 'rocketgate_connections', { protocol: 'mqtt' })), 'mqtt_connections'),
      card('Messages in (MQTT)', fmtInt(msum(fams, 'rocketgate_messages_in_total', { protocol: 'mqtt' })), 'mqtt_in'),
      card('Messages out (MQTT)', fmtInt(msum(fams, 'rocketgate_messages_out_total', { protocol: 'mqtt' })), 'mqtt_out'),
    );
    let data;
    try {
      data = await api('/v1/mqtt/sessions');
    } catch (e) {
      if (!missing(e)) throw e;
      box.replaceChildren(notAvailable('Sessions', 'GET /v1/mqtt/sessions'));
      return;
    }
    const rows = Array.isArray(data) ? data : data.sessions || [];
    const kick = async (id) => {
      try {
        await api('/v1/mqtt/sessions/' + enc(id), { method: 'DELETE' });
        banner(`Kicked ${id}`, 'info');
      } catch (e) {
        banner(`Kick refused: ${e.message}`);
      }
    };
    const subs = (v) => (Array.isArray(v) ? v.map((x) => (x && typeof x === 'object' ? `${x.filter} (QoS ${x.qos})` : x)).join(', ') : cellText(v));
    const known = ['client_id', 'connected', 'protocol_version', 'user', 'remote', 'subscriptions', 'inflight', 'clean_start', 'expiry_secs', 'since_ms'];
    const cols = [
      { key: 'client_id', label: 'client id', fmt: (v) => h('code', {}, v) },
      { key: 'connected', label: 'state', fmt: (v) => h('span', { class: 'pill ' + (v ? 'master' : 'slave') }, v ? 'connected' : 'offline') },
      { key: 'protocol_version', label: 'MQTT', fmt: (v) => (v === 5 ? '5' : v === 4 ? '3.1.1' : cellText(v)) },
      { key: 'user', label: 'user' }, { key: 'remote', label: 'remote' },
      { key: 'subscriptions', label: 'subscriptions', fmt: subs },
      { key: 'inflight', label: 'in flight', num: true },
      { key: 'clean_start', label: 'clean', fmt: (v) => (v ? 'yes' : 'no') },
      { key: 'expiry_secs', label: 'expiry (s)', num: true },
      { key: 'since_ms', label: 'since', fmt: fmtTime },
      // Whatever else the server reports.
      ...[...new Set(rows.flatMap(Object.keys))].filter((k) => !known.includes(k)).map((k) => ({ key: k, label: k.replace(/_/g, ' ') })),
    ];
    const parts = [table(rows, cols, {
      id: 'sessions-table', empty: 'no sessions',
      row: (s) => ({ 'data-client': s.client_id }),
      extra: (s) => writeButton('Kick', { class: 'kick danger', 'data-client': s.client_id }, () => kick(s.client_id)),
    })];
    try {
      const all = await api('/v1/connections');
      parts.push(h('h2', {}, 'Clients of every door'), table(Array.isArray(all) ? all : all.connections || [], null, { id: 'connections-table', empty: 'no clients' }));
    } catch (e) {
      if (!missing(e)) throw e;
    }
    box.replaceChildren(...parts);
  });
};

// ----- configuration -----

/** Flattens nested settings into rows; `{value, source}` objects are one setting. */
function flatten(obj, prefix, out) {
  for (const [k, v] of Object.entries(obj || {})) {
    const key = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === 'object' && !Array.isArray(v) && !('value' in v && 'source' in v)) flatten(v, key, out);
    else if (v && typeof v === 'object' && 'value' in v && 'source' in v) out.push({ setting: key, value: cellText(v.value), source: v.source });
    else out.push({ setting: key, value: cellText(v), source: null });
  }
  return out;
}

pages.config = async () => {
  const box = h('div', { id: 'config' });
  const filter = h('input', { id: 'config-filter', placeholder: 'filter' });
  mount(h('h1', {}, 'Configuration'), h('div', { class: 'toolbar' }, h('label', {}, 'Filter', filter)), box);
  let rows;
  try {
    const c = await api('/v1/config');
    if (Array.isArray(c)) rows = c;
    else if (Array.isArray(c.settings)) rows = c.settings;
    else rows = flatten(c, '', []);
  } catch (e) {
    if (!missing(e)) throw e;
    box.replaceChildren(notAvailable('Effective settings', 'GET /v1/config'));
    return;
  }
  const draw = () => {
    const f = filter.value.toLowerCase();
    const shown = rows.filter((r) => !f || JSON.stringify(r).toLowerCase().includes(f));
    box.replaceChildren(table(shown, null, { id: 'config-table' }));
  };
  filter.oninput = draw;
  draw();
};

// ----- all metrics (generic) -----

pages.metrics = async () => {
  const filter = h('input', { id: 'metrics-filter', placeholder: 'filter by name' });
  const box = h('div', { id: 'metrics' });
  mount(h('h1', {}, 'Metrics'), h('p', { class: 'muted' }, 'Every family /metrics exposes, parsed from the Prometheus text format.'), h('div', { class: 'toolbar' }, h('label', {}, 'Filter', filter)), box);
  let fams = new Map();
  const draw = () => {
    const f = filter.value.toLowerCase();
    const rows = [];
    for (const fam of fams.values()) {
      if (f && !fam.name.includes(f)) continue;
      for (const s of fam.samples) {
        if (s.name.endsWith('_bucket')) continue;
        rows.push({ metric: s.name, labels: Object.entries(s.labels).map(([k, v]) => `${k}="${v}"`).join(' '), value: s.value, type: fam.type });
      }
    }
    box.replaceChildren(table(rows, [
      { key: 'metric', label: 'metric', fmt: (v) => h('code', {}, v) }, { key: 'type', label: 'type' },
      { key: 'labels', label: 'labels', fmt: (v) => h('code', {}, v) }, { key: 'value', label: 'value', num: true, fmt: (v) => (Number.isInteger(v) ? fmtInt(v) : String(Math.round(v * 1e6) / 1e6)) },
    ], { id: 'metrics-table' }));
  };
  filter.oninput = draw;
  every(5000, async () => { fams = await scrape(); draw(); });
};

// ---------- router ----------

async function route() {
  for (const t of state.timers) clearInterval(t);
  state.timers = [];
  banner('');
  const [, name = 'overview', ...rest] = (location.hash || '#/overview').split('/');
  const arg = rest.length ? decodeURIComponent(rest.join('/')) : null;
  const page = pages[name] ? name : 'overview';
  state.page = page;
  document.querySelectorAll('#nav a').forEach((a) => a.classList.toggle('active', a.dataset.page === page));
  document.body.dataset.page = page;
  try {
    await session();
    await pages[page](arg);
  } catch (e) {
    banner(e.message);
  }
}

window.addEventListener('hashchange', route);
route();
