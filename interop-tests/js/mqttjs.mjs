// MQTT.js (the `mqtt` npm package, 5.x) against a running rocketgate, over TCP
// (`mqtt://host:port`) or WebSocket (`ws://host:port/mqtt`).
//
//   node mqttjs.mjs --url mqtt://127.0.0.1:1883 --version 5 --prefix js5tcp
//   node mqttjs.mjs --url ws://127.0.0.1:8083/mqtt --only sessionAway --session ID
//
// Runs every scenario one after the other and prints ONE JSON object on stdout:
// `{"ok": true, "results": {<scenario>: <what MQTT.js observed>}}`. It reports what
// it saw, it does not judge: the Rust test (interop-tests/tests/mqttjs.rs) asserts.
// On a failure or when the whole run exceeds --timeout seconds it prints
// `{"ok": false, "error": ..., "scenario": ..., "results": <partial>}` and exits 1,
// so a broken broker fails the test instead of hanging it.
import mqtt from "mqtt";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, a, i, all) => {
    if (a.startsWith("--")) pairs.push([a.slice(2), all[i + 1]]);
    return pairs;
  }, []),
);
const URL_ = args.url ?? "mqtt://127.0.0.1:1883";
const VERSION = Number(args.version ?? 5);
const P = args.prefix ?? `js${VERSION}`;
const WAIT_MS = 20_000;
const results = {};
let current = "start";
const clients = [];

function finish(report, code) {
  process.stdout.write(JSON.stringify(report) + "\n");
  for (const c of clients) c.end(true);
  process.exit(code);
}
setTimeout(
  () => finish({ ok: false, error: `timed out after ${args.timeout ?? 120} s`, scenario: current, results }, 1),
  Number(args.timeout ?? 120) * 1000,
);

for (const event of ["uncaughtException", "unhandledRejection"])
  process.on(event, (e) => finish({ ok: false, error: `${event}: ${e?.stack ?? e}`, scenario: current, results }, 1));

/** What a delivered PUBLISH looked like, in JSON-friendly form. */
function seen(topic, payload, packet) {
  const p = packet.properties ?? {};
  const props = {};
  if (p.userProperties) props.user = p.userProperties;
  if (p.responseTopic !== undefined) props.responseTopic = p.responseTopic;
  if (p.correlationData !== undefined) props.correlationData = Buffer.from(p.correlationData).toString("base64");
  if (p.contentType !== undefined) props.contentType = p.contentType;
  return { topic, payload: payload.toString(), qos: packet.qos, retain: packet.retain, props };
}

/**
 * Connects a client and resolves with it once CONNACK arrived. Every delivered
 * message is collected in `client.inbox` (the handler is attached before any
 * packet can arrive); `client.connack` is the CONNACK.
 */
function connect(clientId, options = {}) {
  const client = mqtt.connect(URL_, {
    protocolVersion: VERSION,
    clientId,
    clean: true,
    reconnectPeriod: 0,
    connectTimeout: WAIT_MS,
    keepalive: 30,
    ...options,
  });
  clients.push(client);
  client.inbox = [];
  client.waiters = [];
  client.errors = [];
  // Errors after CONNACK are kept (an unhandled "error" event would crash node).
  client.on("error", (e) => client.errors.push(e.message));
  client.on("message", (topic, payload, packet) => {
    client.inbox.push(seen(topic, payload, packet));
    client.waiters = client.waiters.filter((w) => !w());
  });
  return new Promise((resolve, reject) => {
    client.once("connect", (connack) => {
      client.connack = connack;
      resolve(client);
    });
    client.once("error", (e) => reject(new Error(`${clientId}: ${e.message}`)));
    client.once("close", () => reject(new Error(`${clientId}: closed before CONNACK`)));
  });
}

/** Resolves with the inbox once `done(inbox)` holds; rejects after WAIT_MS. */
function until(client, what, done) {
  return new Promise((resolve, reject) => {
    const check = () => {
      if (!done(client.inbox)) return false;
      resolve(client.inbox);
      return true;
    };
    if (check()) return;
    const timer = setTimeout(
      () => reject(new Error(`${client.options.clientId}: no ${what} within ${WAIT_MS} ms; got ${JSON.stringify(client.inbox)}`)),
      WAIT_MS,
    );
    client.waiters.push(() => check() && (clearTimeout(timer), true));
  });
}
const count = (n) => (inbox) => inbox.length >= n;
const has = (topic) => (inbox) => inbox.some((m) => m.topic === topic);

/** Ends a client cleanly (DISCONNECT) and waits until its socket is closed. */
const end = (client) => client.endAsync();

/** Connect options of a persistent session. */
const persistent = () =>
  VERSION === 5 ? { clean: false, properties: { sessionExpiryInterval: 600 } } : { clean: false };

/** SUBSCRIBE, resolving with the granted QoS / reason codes. */
async function subscribe(client, filters, opts) {
  const granted = await client.subscribeAsync(filters, opts);
  return granted.map((g) => g.qos);
}

// Each scenario uses its own first topic level (= core topic) `${P}<letter>`.
const scenarios = {
  // QoS 0, 1 and 2 published, delivered to a QoS 2 subscription at the publish QoS.
  async qos() {
    const sub = await connect(`${P}-qos-sub`);
    const granted = await subscribe(sub, `${P}q/#`, { qos: 2 });
    const pub = await connect(`${P}-qos-pub`);
    await pub.publishAsync(`${P}q/zero`, "q0", { qos: 0 });
    await pub.publishAsync(`${P}q/one`, "q1", { qos: 1 });
    await pub.publishAsync(`${P}q/two`, "q2", { qos: 2 });
    const got = await until(sub, "3 messages", count(3));
    await Promise.all([end(sub), end(pub)]);
    return { granted, received: got };
  },

  // `+` and `#`, two overlapping subscriptions on one client (delivered once).
  async wildcard() {
    const sub = await connect(`${P}-wc-sub`);
    const granted = await subscribe(sub, { [`${P}w/+/temp`]: { qos: 1 }, [`${P}w/room1/#`]: { qos: 0 } });
    const pub = await connect(`${P}-wc-pub`);
    for (const t of ["room1/temp", "room1/hum", "room2/temp", "room2/hum", "room1/end"])
      await pub.publishAsync(`${P}w/${t}`, t, { qos: 1 });
    const got = await until(sub, "the end marker", has(`${P}w/room1/end`));
    await Promise.all([end(sub), end(pub)]);
    return { granted, received: got };
  },

  // Retained: set, replace, then clear with an empty payload.
  async retained() {
    const pub = await connect(`${P}-ret-pub`);
    await pub.publishAsync(`${P}r/state`, "on", { qos: 1, retain: true });
    await pub.publishAsync(`${P}r/state`, "off", { qos: 1, retain: true });
    const first = await connect(`${P}-ret-sub1`);
    await subscribe(first, `${P}r/#`, { qos: 1 });
    await pub.publishAsync(`${P}r/marker`, "after subscribe 1", { qos: 1 });
    const afterSet = await until(first, "the marker", has(`${P}r/marker`));
    await end(first);

    await pub.publishAsync(`${P}r/state`, "", { qos: 1, retain: true });
    const second = await connect(`${P}-ret-sub2`);
    await subscribe(second, `${P}r/#`, { qos: 1 });
    await pub.publishAsync(`${P}r/marker`, "after subscribe 2", { qos: 1 });
    const afterClear = await until(second, "the marker", has(`${P}r/marker`));
    await Promise.all([end(second), end(pub)]);
    return { afterSet, afterClear };
  },

  // A will: not published after a clean DISCONNECT, published when the socket dies.
  async will() {
    const watcher = await connect(`${P}-will-watch`);
    await subscribe(watcher, `${P}l/#`, { qos: 1 });
    const polite = await connect(`${P}-will-polite`, {
      will: { topic: `${P}l/polite`, payload: Buffer.from("must not be sent"), qos: 1, retain: false },
    });
    await end(polite);
    const doomed = await connect(`${P}-will-doomed`, {
      will: { topic: `${P}l/doomed`, payload: Buffer.from("gone"), qos: 1, retain: false },
    });
    doomed.stream.destroy(); // no DISCONNECT: the connection just ends
    const got = await until(watcher, "the will", has(`${P}l/doomed`));
    await end(watcher);
    return { received: got };
  },

  // A persistent session (3.1.1: clean session 0; 5: clean start 0 + session
  // expiry) gets, on reconnect, what was published while it was away.
  async session() {
    const id = `${P}-persistent-${process.pid}`;
    const away = await scenarios.sessionAway(id);
    return { ...away, ...(await scenarios.sessionBack(id)) };
  },

  // The first half: subscribe with a persistent session, leave, 3 messages published.
  // (`--only sessionAway --session ID`, then restart the broker, then `sessionBack`.)
  async sessionAway(id = args.session) {
    const before = await connect(id, persistent());
    const granted = await subscribe(before, `${P}s/#`, { qos: 1 });
    await end(before);
    const pub = await connect(`${P}-sess-pub`);
    for (const n of [1, 2, 3]) await pub.publishAsync(`${P}s/offline`, `offline ${n}`, { qos: 1 });
    await end(pub);
    return { granted, firstSessionPresent: before.connack.sessionPresent };
  },

  // The second half: come back and get the 3 offline messages; then drop the session.
  async sessionBack(id = args.session) {
    const after = await connect(id, persistent());
    const got = await until(after, "3 offline messages", count(3));
    await end(after);
    await end(await connect(id, { clean: true }));
    return { sessionPresent: after.connack.sessionPresent, received: got };
  },

  // MQTT 5 request/response: user properties, response topic, correlation data.
  async requestResponse() {
    if (VERSION !== 5) return { skipped: "MQTT 5 only" };
    const responder = await connect(`${P}-rr-responder`);
    await subscribe(responder, `${P}p/request`, { qos: 1 });
    responder.on("message", (topic, payload, packet) => {
      const p = packet.properties ?? {};
      if (topic !== `${P}p/request` || !p.responseTopic) return;
      responder.publish(p.responseTopic, `re: ${payload}`, {
        qos: 1,
        properties: { correlationData: p.correlationData, userProperties: { answered: "yes" } },
      });
    });
    const requester = await connect(`${P}-rr-requester`);
    await subscribe(requester, `${P}p/reply/#`, { qos: 1 });
    await requester.publishAsync(`${P}p/request`, "what time is it", {
      qos: 1,
      properties: {
        responseTopic: `${P}p/reply/requester`,
        correlationData: Buffer.from([0, 1, 2, 0xfa]),
        userProperties: { unit: "C", room: "kitchen" },
        contentType: "text/plain",
      },
    });
    const reply = await until(requester, "the reply", count(1));
    const request = await until(responder, "the request", count(1));
    await Promise.all([end(responder), end(requester)]);
    return { request: request[0], reply: reply[0] };
  },

  // `$share/<group>/<filter>`: each message to exactly one member; a plain
  // subscriber of the same filter gets them all.
  async shared() {
    const filter = `${P}h/#`;
    const a = await connect(`${P}-share-a`);
    const b = await connect(`${P}-share-b`);
    const plain = await connect(`${P}-share-plain`);
    const grantedA = await subscribe(a, `$share/workers/${filter}`, { qos: 1 });
    const grantedB = await subscribe(b, `$share/workers/${filter}`, { qos: 1 });
    await subscribe(plain, filter, { qos: 1 });
    const publishers = [await connect(`${P}-share-pub1`), await connect(`${P}-share-pub2`)];
    const total = 20;
    for (let i = 0; i < total; i++)
      await publishers[i % 2].publishAsync(`${P}h/job`, `job ${i}`, { qos: 1 });
    await until(plain, `${total} messages`, count(total));
    // Wait for the group's deliveries to add up to what was published.
    await new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`group got ${a.inbox.length}+${b.inbox.length} of ${total}`)),
        WAIT_MS,
      );
      const check = () => {
        if (a.inbox.length + b.inbox.length < total) return false;
        clearTimeout(timer);
        resolve();
        return true;
      };
      if (!check()) { a.waiters.push(check); b.waiters.push(check); }
    });
    await Promise.all([a, b, plain, ...publishers].map(end));
    const payloads = (c) => c.inbox.map((m) => m.payload);
    return { granted: [...grantedA, ...grantedB], a: payloads(a), b: payloads(b), plain: payloads(plain) };
  },
};

const halves = ["sessionAway", "sessionBack"];
const only = args.only ? args.only.split(",") : Object.keys(scenarios).filter((s) => !halves.includes(s));
try {
  for (const name of only) {
    current = name;
    results[name] = await scenarios[name]();
  }
  // Errors a client reported after its CONNACK (none expected).
  const clientErrors = Object.fromEntries(
    clients.filter((c) => c.errors.length).map((c) => [c.options.clientId, c.errors]),
  );
  finish({ ok: true, version: VERSION, url: URL_, clientErrors, results }, 0);
} catch (e) {
  finish({ ok: false, error: String(e?.stack ?? e), scenario: current, results }, 1);
}
