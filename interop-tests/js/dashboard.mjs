// Drives the web dashboard (/dashboard) in headless Chromium with playwright-core:
// opens every page against a live node that has traffic, checks the numbers shown
// against the admin API (fetched here, independently of the page), runs a message
// search and a dead-letter resend by clicking, kicks an MQTT session when the node
// has that endpoint, and saves a screenshot of each page. Prints one JSON report:
// {"ok": bool, "checks": [...], "error": "..."}; interop-tests/tests/dashboard.rs
// asserts on it.
//
//   node dashboard.mjs --http http://127.0.0.1:8080 --out ../../docs/images \
//     --key-topic orders --key order-7 --binary-id <msg id> --dlq-group audit \
//     --mqtt-client dash-sensor [--admin-key rg_…] [--readonly-user u --readonly-password p]

import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
const base = args.http;
const out = args.out;
const timeoutS = Number(args.timeout || 50);

const report = { ok: false, checks: [], skipped: [], error: null, screenshots: [] };
const done = (code) => {
  process.stdout.write(JSON.stringify(report) + '\n');
  process.exit(code);
};
setTimeout(() => {
  report.error = `timed out after ${timeoutS} s (last check: ${JSON.stringify(report.checks.at(-1) || null)})`;
  done(1);
}, timeoutS * 1000).unref();

const authHeader = (user, password) => (user ? { authorization: 'Basic ' + Buffer.from(`${user}:${password}`).toString('base64') } : {});
// The admin signs in with an API key (Bearer), the read-only user with a password (Basic).
const adminAuth = args['admin-key'] ? { authorization: 'Bearer ' + args['admin-key'] } : {};

async function apiGet(path, headers = adminAuth) {
  const r = await fetch(base + path, { headers });
  const text = await r.text();
  if (!r.ok) throw new Error(`GET ${path}: ${r.status} ${text}`);
  return r.headers.get('content-type')?.includes('json') ? JSON.parse(text) : text;
}
async function apiStatus(path) {
  return (await fetch(base + path, { headers: adminAuth })).status;
}

function check(name, cond, detail) {
  report.checks.push({ name, ok: !!cond, detail });
  if (!cond) throw new Error(`check failed: ${name}: ${JSON.stringify(detail)}`);
}

/** Polls `fn` until it returns a truthy value (or `timeoutMs` passes). */
async function until(what, fn, timeoutMs = 8000) {
  const end = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e.message;
    }
    if (Date.now() > end) throw new Error(`waited ${timeoutMs} ms for ${what}; last: ${JSON.stringify(last)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const num = (s) => Number(String(s).replace(/[^0-9.\-]/g, ''));

async function shot(page, name) {
  if (!out) return;
  mkdirSync(out, { recursive: true });
  const path = join(out, `dashboard-${name}.png`);
  await page.screenshot({ path, fullPage: true });
  report.screenshots.push(path);
}

async function signIn(page, user, password) {
  await page.waitForSelector('#login[open]', { timeout: 8000 });
  await page.check('input[name=kind][value=password]');
  await page.fill('#login-user', user);
  await page.fill('#login-password-input', password);
  await page.click('#login-submit');
}

async function signInWithKey(page, key) {
  await page.waitForSelector('#login[open]', { timeout: 8000 });
  await page.check('input[name=kind][value=token]');
  await page.fill('#login-token-input', key);
  await page.click('#login-submit');
}

async function overview(page) {
  const broker = await apiGet('/v1/broker');
  const cluster = await apiGet('/v1/cluster');
  await page.goto(base + '/dashboard#/overview');
  if (args['admin-key']) {
    await signInWithKey(page, args['admin-key']);
    await until('signed in as admin', async () => (await page.textContent('#who-role')) === 'admin');
    check('auth: the page asked for credentials and the admin key was taken', true, await page.textContent('#who'));
  }
  const text = async (sel) => (await page.textContent(sel)).trim();
  await until('the broker card', async () => (await text('[data-k=broker_name]')) === broker.broker_name);
  check('overview: broker name', true, broker.broker_name);
  check('overview: cluster', (await text('[data-k=cluster]')) === broker.cluster, await text('[data-k=cluster]'));
  check('overview: version', (await text('[data-k=version]')) === broker.version, broker.version);
  const role = broker.replication ? broker.replication.role : 'standalone';
  check('overview: role', (await text('[data-k=role]')) === role, role);
  await until('user topics', async () => num(await text('[data-k=user_topics]')) === (await apiGet('/v1/broker')).user_topics);
  check('overview: user topics', true, broker.user_topics);
  const disk = (await text('[data-k=disk_usage]'));
  check('overview: disk usage', Math.abs(num(disk) - broker.store.disk_usage * 100) < 2, { shown: disk, api: broker.store.disk_usage });
  const addrs = cluster.brokers.flatMap((b) => Object.entries(b.addrs).map(([id, a]) => [b.broker_name, id, a]));
  await until('the nodes table', async () => (await page.$$('#nodes-table tbody tr')).length === addrs.length);
  for (const [name, , addr] of addrs) {
    check(`overview: node ${name} ${addr}`, (await page.textContent('#nodes-table')).includes(addr), addr);
  }
  for (const [name, id, addr] of addrs) {
    const row = await page.$$eval('#nodes-table tbody tr', (trs, a) => trs.map((tr) => tr.textContent).find((t) => t.includes(a)), addr);
    const want = id === '0' ? 'master' : 'slave';
    check(`overview: ${name} ${addr} is a ${want}`, row && row.includes(want), row);
  }
  const repl = broker.replication;
  if (repl && repl.role === 'master') {
    await until('the slaves table', async () => (await page.$$('#slaves-table tbody tr[data-slave]')).length === repl.slaves.length);
    for (const sl of repl.slaves) {
      // A slave that reconnected (a busy machine: 4 missed heartbeats) has a new source
      // port; the page and the API must agree on the current one.
      let last = '';
      const shown = await until(`overview: slave ${sl.broker_id}`, async () => {
        const now = ((await apiGet('/v1/broker')).replication?.slaves ?? []).find((s) => s.broker_id === sl.broker_id);
        last = (await page.textContent(`#slaves-table tr[data-slave="${sl.broker_id}"]`)) ?? '';
        return now && last.includes(now.addr);
      }, 15000).then(() => true, () => false);
      check(`overview: slave ${sl.broker_id} at its current address`, shown, last);
    }
    const mode = await page.textContent('#replication-facts');
    check('overview: replication mode', mode.includes(repl.mode), repl.mode);
  }
  // Messages in, as shown, is between two scrapes around the page's.
  const metricsIn = async () => {
    const text = await apiGet('/metrics');
    return text.split('\n').filter((l) => l.startsWith('rocketgate_messages_in_total')).reduce((a, l) => a + Number(l.split(' ').at(-1)), 0);
  };
  await until('messages in matching /metrics', async () => {
    const before = await metricsIn();
    await page.waitForTimeout(1200);
    const shown = num(await text('[data-k=messages_in]'));
    const after = await metricsIn();
    return shown >= before && shown <= after && before === after;
  }, 10000);
  check('overview: messages in = /metrics sum', true, null);
  const ready = await fetch(base + '/readyz');
  if (ready.status !== 404) {
    const checks = (await ready.json()).checks;
    await until('readiness', async () => (await page.$$('#readiness-table tbody tr')).length === checks.length);
    check('overview: readiness like /readyz', (await text('#ready-state')) === (ready.ok ? 'ready' : 'not ready'), ready.status);
  }
  // Live traffic while the page is open: the rate chart must show it.
  let publishing = true;
  const publisher = (async () => {
    let n = 0;
    while (publishing) {
      await fetch(`${base}/v1/topics/orders/messages?tag=live`, { method: 'POST', body: `live ${n++}`, headers: adminAuth });
      if (n % 3 === 0) {
        // A reader: messages out, acked.
        const got = await (await fetch(`${base}/v1/groups/live-reader/topics/orders/messages?max=4&start=latest`, { headers: adminAuth })).json();
        const handles = (got.messages || []).map((m) => m.receipt_handle);
        if (handles.length) {
          await fetch(`${base}/v1/groups/live-reader/acks`, { method: 'POST', body: JSON.stringify({ receipt_handles: handles }), headers: { 'content-type': 'application/json', ...adminAuth } });
        }
      }
      await new Promise((r) => setTimeout(r, 25 + 20 * Math.sin(n / 8)));
    }
  })();
  await until('a non-zero in rate', async () => {
    const now = await text('#chart-rates .now');
    return num(now.split('·')[0]) > 0 && now;
  }, 10000);
  check('overview: live in rate > 0', true, await text('#chart-rates .now'));
  check('overview: rate chart drawn', (await page.$$('#chart-rates polyline')).length === 2, null);
  await page.waitForTimeout(5000);
  await shot(page, 'overview');
  publishing = false;
  await publisher;
}

async function topics(page) {
  await page.goto(base + '/dashboard#/topics');
  const list = (await apiGet('/v1/topics')).topics;
  for (const t of list) {
    const d = await apiGet('/v1/topics/' + encodeURIComponent(t.name));
    const stored = d.queues.reduce((a, q) => a + q.max_offset - q.min_offset, 0);
    await until(`topic ${t.name} messages = ${stored}`, async () => {
      const cell = await page.$(`tr[data-topic="${t.name}"] td[data-k=messages]`);
      return cell && num(await cell.textContent()) === stored;
    });
    check(`topics: ${t.name} stored ${stored}`, true, stored);
  }
  check('topics: one row per topic', (await page.$$('#topics-table tbody tr')).length === list.length, list.length);
  await shot(page, 'topics');
  // Detail: one row per queue with the API's offsets.
  const name = args['key-topic'];
  await page.click(`tr[data-topic="${name}"] a`);
  const d = await apiGet('/v1/topics/' + encodeURIComponent(name));
  await until('the queue table', async () => (await page.$$('#queues-table tbody tr')).length === d.queues.length);
  for (const q of d.queues) {
    const max = num(await page.textContent(`#queues-table tr[data-queue="${q.queue_id}"] td[data-k=max_offset]`));
    check(`topic ${name}: queue ${q.queue_id} max offset`, max === q.max_offset, { shown: max, api: q.max_offset });
  }
  check('topic detail: a bar per queue', (await page.$$('#chart-queues rect.bar')).length === d.queues.length, null);
}

async function groups(page) {
  await page.goto(base + '/dashboard#/groups');
  const names = (await apiGet('/v1/groups')).groups;
  for (const g of names) {
    const d = await apiGet('/v1/groups/' + encodeURIComponent(g));
    await until(`group ${g} lag ${d.lag}`, async () => {
      const cell = await page.$(`tr[data-group="${g}"] td[data-k=lag]`);
      return cell && num(await cell.textContent()) === d.lag;
    });
    check(`groups: ${g} lag ${d.lag}`, true, d.lag);
  }
  const lagging = args['lag-group'];
  await page.click(`tr[data-group="${lagging}"] a`);
  const d = await apiGet('/v1/groups/' + encodeURIComponent(lagging));
  check('groups: the lagging group has lag', d.lag > 0, d.lag);
  await until('the progress table', async () => (await page.$$('#progress-table tbody tr')).length === d.progress.length);
  for (const p of d.progress) {
    const lag = num(await page.textContent(`#progress-table tr[data-queue="${p.topic}:${p.queue_id}"] td[data-k=lag]`));
    check(`group ${lagging}: ${p.topic}:${p.queue_id} lag`, lag === p.lag, { shown: lag, api: p.lag });
  }
  check('group detail: a bar per queue', (await page.$$('#chart-queue-lag rect.bar')).length === d.progress.length, null);
  check('group detail: total lag card', num(await page.textContent('[data-k=lag]')) === d.lag, d.lag);
  await page.waitForSelector('#members-table');
  if ((await apiStatus(`/v1/groups/${encodeURIComponent(lagging)}/connections`)) !== 404) {
    const conns = (await apiGet(`/v1/groups/${encodeURIComponent(lagging)}/connections`)).connections;
    await until('the connections table', async () => (await page.$$('#connections-table tbody tr')).length === conns.length && conns.length > 0);
    check(`group ${lagging}: connections across doors (${conns.map((c) => c.door)})`, (await page.textContent('#connections-table')).includes(conns[0].door), conns.length);
  }
  await page.waitForTimeout(300);
  await shot(page, 'groups');
}

async function messages(page) {
  await page.goto(base + '/dashboard#/messages');
  // By key: the page's answer is the API's.
  const topic = args['key-topic'], key = args.key;
  const api = (await apiGet(`/v1/topics/${encodeURIComponent(topic)}/messages?key=${encodeURIComponent(key)}`)).messages;
  check('search by key: the API finds it', api.length >= 1, api.length);
  await page.selectOption('#search-mode', 'key');
  await page.fill('#search-topic', topic);
  await page.fill('#search-key', key);
  await page.click('#search-go');
  await until('key search results', async () => (await page.$$('#search-table tbody tr[data-msg]')).length === api.length);
  check('search by key: same count as the API', true, api.length);
  await page.click(`#search-table tr[data-msg="${api[0].msg_id}"]`);
  await page.waitForSelector('#message-properties');
  for (const [k, v] of Object.entries(api[0].properties)) {
    check(`message: property ${k}`, (await page.textContent('#message-properties')).includes(v), { k, v });
  }
  check('message: body as text', (await page.textContent('#message-body')) === api[0].body, api[0].body);
  await until('the delivery table', async () => page.$('#deliveries-table'));
  const deliveries = await page.textContent('#deliveries-table');
  check('message: delivered to the consuming group', deliveries.includes(args['lag-group']) && deliveries.includes('consumed'), deliveries);

  // By id: the binary message, shown as hex.
  const binId = args['binary-id'];
  const bin = await apiGet('/v1/messages/' + binId + '?encoding=base64');
  await page.selectOption('#search-mode', 'id');
  await page.fill('#search-id', binId);
  await page.click('#search-go');
  await page.waitForSelector(`#message-detail`);
  await until('the detail of the id', async () => (await page.textContent('#message-detail h2')).includes(binId));
  const hexShown = await page.textContent('#message-body');
  const hex = [...Buffer.from(bin.body, 'base64')].slice(0, 16).map((b) => b.toString(16).padStart(2, '0')).join(' ');
  check('search by id: binary body as hex', hexShown.includes(hex), { hexShown: hexShown.slice(0, 80), hex });
  await page.click('#body-text');
  check('message: text view toggles', (await page.$eval('#message-body', (e) => e.dataset.mode)) === 'text', null);
  await page.click('#body-hex');

  // By time range: every message of the topic stored in the last hour.
  const end = Date.now() + 60000, begin = Date.now() - 3600000;
  const inRange = (await apiGet(`/v1/topics/${encodeURIComponent(topic)}/messages?begin_ms=${begin}&end_ms=${end}`)).messages;
  await page.selectOption('#search-mode', 'time');
  await page.fill('#search-topic', topic);
  await page.click('#search-go');
  await until('time search results', async () => (await page.$$('#search-table tbody tr[data-msg]')).length === inRange.length);
  check(`search by time: ${inRange.length} like the API`, true, inRange.length);
  // Back to the binary message for the screenshot.
  await page.selectOption('#search-mode', 'id');
  await page.fill('#search-id', binId);
  await page.click('#search-go');
  await until('the detail of the id', async () => (await page.textContent('#message-detail h2')).includes(binId));
  await page.waitForTimeout(300);
  await shot(page, 'messages');
}

async function dlq(page) {
  const group = args['dlq-group'];
  const listing = await apiGet(`/v1/groups/${encodeURIComponent(group)}/dlq?offset=0&max=32`);
  check('dlq: the API lists the dead letter', listing.messages.length >= 1, listing.messages.length);
  await page.goto(base + '/dashboard#/dlq/' + encodeURIComponent(group));
  await until('the dlq table', async () => (await page.$$('#dlq-table tbody tr[data-offset]')).length === listing.messages.length);
  check('dlq: one row per dead letter', true, listing.messages.length);
  const count = num(await page.textContent(`#dlq-groups-table tr[data-group="${group}"] td[data-k=messages]`));
  check('dlq: count per group', count === listing.messages.length, count);
  await shot(page, 'dlq');
  const m = listing.messages[0];
  const origin = m.properties.RETRY_TOPIC || m.properties.REAL_TOPIC || args['dlq-topic'];
  const before = await apiGet('/v1/topics/' + encodeURIComponent(origin));
  const maxBefore = before.queues.reduce((a, q) => a + q.max_offset, 0);
  await page.click(`button.resend[data-offset="${m.queue_offset}"]`);
  await until('the resend banner', async () => {
    const t = await page.textContent('#banner');
    if (t.startsWith('Re-send refused')) throw new Error(t);
    return t.includes('Re-sent 1') && t;
  });
  check('dlq: resend by click answered', true, await page.textContent('#banner'));
  await until('the re-sent message back in its topic', async () => {
    const after = await apiGet('/v1/topics/' + encodeURIComponent(origin));
    return after.queues.reduce((a, q) => a + q.max_offset, 0) === maxBefore + 1;
  });
  check(`dlq: the message is back in ${origin}`, true, null);
}

async function mqtt(page) {
  await page.goto(base + '/dashboard#/mqtt');
  const status = await apiStatus('/v1/mqtt/sessions');
  const metrics = await apiGet('/metrics');
  const conns = metrics.split('\n').filter((l) => l.startsWith('rocketgate_connections{protocol="mqtt"}')).reduce((a, l) => a + Number(l.split(' ').at(-1)), 0);
  await until('the MQTT connection count', async () => num(await page.textContent('[data-k=mqtt_connections]')) === conns);
  check(`mqtt: connections ${conns} like /metrics`, conns >= 1, conns);
  const client = args['mqtt-client'];
  if (status === 404) {
    await page.waitForSelector('.not-available');
    report.skipped.push('mqtt: no GET /v1/mqtt/sessions in this build: sessions list and kick not checked');
    await shot(page, 'mqtt');
    return;
  }
  const sessions = await apiGet('/v1/mqtt/sessions');
  const rows = Array.isArray(sessions) ? sessions : sessions.sessions;
  await until('the sessions table', async () => (await page.$$('#sessions-table tbody tr[data-client]')).length === rows.length);
  check('mqtt: one row per session', rows.some((s) => s.client_id === client), rows.length);
  await shot(page, 'mqtt');
  await page.click(`button.kick[data-client="${client}"]`);
  await until('the kick banner', async () => {
    const b = await page.$('#banner.info');
    return b && (await b.textContent()).includes(client);
  });
  await until('the session disconnected', async () => {
    const s = await apiGet('/v1/mqtt/sessions');
    const r = (Array.isArray(s) ? s : s.sessions).find((x) => x.client_id === client);
    return !r || r.connected === false;
  });
  check('mqtt: kicked by click', true, client);
}

async function config(page) {
  await page.goto(base + '/dashboard#/config');
  if ((await apiStatus('/v1/config')) === 404) {
    await page.waitForSelector('.not-available');
    report.skipped.push('config: no GET /v1/config in this build');
    await shot(page, 'config');
    return;
  }
  await page.waitForSelector('#config-table tbody tr');
  const settings = (await apiGet('/v1/config')).settings;
  const n = (await page.$$('#config-table tbody tr')).length;
  check('config: one row per setting', n === settings.length, { shown: n, api: settings.length });
  const name = settings.find((x) => x.key === 'broker.name');
  const row = await page.$$eval('#config-table tbody tr', (trs) => trs.map((tr) => tr.textContent).find((t) => t.startsWith('broker.name')));
  check('config: broker.name with its value and source', row && row.includes(name.value) && row.includes(name.source), row);
  const retries = settings.find((x) => x.key === 'broker.max_reconsume_times');
  await page.fill('#config-filter', 'max_reconsume');
  const filtered = await page.$$eval('#config-table tbody tr', (trs) => trs.map((tr) => tr.textContent));
  check('config: filter', filtered.length >= 1 && filtered.every((t) => t.includes('max_reconsume')) && filtered.some((t) => t.includes(String(retries.value))), filtered);
  await page.fill('#config-filter', '');
  await shot(page, 'config');
}

async function metricsPage(page) {
  await page.goto(base + '/dashboard#/metrics');
  await page.waitForSelector('#metrics-table tbody tr');
  const families = new Set((await apiGet('/metrics')).split('\n').filter((l) => l.startsWith('# TYPE ')).map((l) => l.split(' ')[2]));
  const shown = await page.textContent('#metrics-table');
  const missingFamilies = [...families].filter((f) => !shown.includes(f));
  check('metrics: every family of /metrics shown', missingFamilies.length === 0, missingFamilies);
}

/** A read-only user sees the pages, the change buttons are disabled, and the server refuses. */
async function readOnly(browser) {
  const page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  await page.goto(base + '/dashboard#/groups');
  await signIn(page, args['readonly-user'], args['readonly-password']);
  await page.waitForSelector('#groups-table tbody tr');
  check('read-only: signed in as read-only', (await page.textContent('#who-role')) === 'read-only', await page.textContent('#who'));
  await page.goto(base + '/dashboard#/dlq/' + encodeURIComponent(args['dlq-group']));
  await page.waitForSelector('#dlq-resend-all');
  check('read-only: resend disabled', await page.$eval('#dlq-resend-all', (b) => b.disabled), null);
  const r = await fetch(`${base}/v1/groups/${encodeURIComponent(args['dlq-group'])}/dlq/resend`, {
    method: 'POST', body: '{"all":true}', headers: { 'content-type': 'application/json', ...authHeader(args['readonly-user'], args['readonly-password']) },
  });
  check('read-only: the server refuses a resend (403)', r.status === 403, r.status);
  // A wrong password is asked again.
  const bad = await browser.newPage();
  await bad.goto(base + '/dashboard#/overview');
  await signIn(bad, args['readonly-user'], 'wrong');
  await bad.waitForSelector('#login[open]');
  await until('the refusal shown', async () => (await bad.textContent('#login-error')).length > 0);
  check('auth: wrong password asked again', true, await bad.textContent('#login-error'));
}

try {
  const browser = await chromium.launch({
    executablePath: args.chromium || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-background-networking'],
  });
  const page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  page.setDefaultTimeout(10000);
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(e.message));
  const only = args.only ? args.only.split(',') : null;
  const steps = { overview, topics, groups, messages, dlq, mqtt, config, metrics: metricsPage };
  for (const [name, step] of Object.entries(steps)) {
    if (!only || only.includes(name)) await step(page);
  }
  if (args['readonly-user']) await readOnly(browser);
  check('no script errors in the page', pageErrors.length === 0, pageErrors);
  await browser.close();
  report.ok = true;
  done(0);
} catch (e) {
  report.error = e.stack || String(e);
  done(1);
}
