"""Scenarios for the MQTT gateway driven by Eclipse Paho (paho-mqtt 2.x).

Usage: paho_check.py HOST PORT SCENARIO
Exits 0 when the scenario behaved as MQTT says, 1 (with a message) otherwise.
Run by gateways/mqtt/tests/paho.rs against a server it started.
"""

import queue
import socket
import sys
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

HOST, PORT, SCENARIO = sys.argv[1], int(sys.argv[2]), sys.argv[3]
WAIT = 20


def fail(msg):
    print(f"FAIL [{SCENARIO}]: {msg}", file=sys.stderr)
    sys.exit(1)


class Client:
    """A paho client whose callbacks feed queues the scenario waits on."""

    def __init__(self, client_id, v5, **kw):
        proto = mqtt.MQTTv5 if v5 else mqtt.MQTTv311
        self.v5 = v5
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=proto, **kw)
        self.messages = queue.Queue()
        self.events = queue.Queue()
        self.c.on_connect = lambda c, u, flags, rc, props: self.events.put(("connack", rc, flags))
        self.c.on_subscribe = lambda c, u, mid, rcs, props: self.events.put(("suback", mid, rcs))
        self.c.on_publish = lambda c, u, mid, rc, props: self.events.put(("puback", mid, rc))
        self.c.on_message = lambda c, u, msg: self.messages.put(msg)

    def connect(self, clean=True, props=None):
        if self.v5:
            self.c.connect(HOST, PORT, keepalive=30, clean_start=clean, properties=props)
        else:
            self.c.connect(HOST, PORT, keepalive=30)
        self.c.loop_start()
        self.wait("connack")
        return self

    def wait(self, kind):
        deadline = time.time() + WAIT
        while time.time() < deadline:
            try:
                ev = self.events.get(timeout=max(0.01, deadline - time.time()))
            except queue.Empty:
                break
            if ev[0] == kind:
                return ev
        fail(f"no {kind} in time")

    def subscribe(self, topic, qos):
        self.c.subscribe(topic, qos)
        self.wait("suback")

    def publish(self, topic, payload, qos, props=None, retain=False):
        info = self.c.publish(topic, payload, qos=qos, retain=retain, properties=props)
        if qos > 0:
            info.wait_for_publish(timeout=WAIT)
            if not info.is_published():
                fail(f"publish to {short(topic)} not acknowledged")

    def message(self):
        try:
            return self.messages.get(timeout=WAIT)
        except queue.Empty:
            fail("no message in time")

    def stop(self):
        self.c.disconnect()
        self.c.loop_stop()


def every_qos(v5):
    tag = "v5" if v5 else "v311"
    sub = Client(f"paho-sub-{tag}", v5).connect()
    sub.subscribe("py/+/reading", 2)
    pub = Client(f"paho-pub-{tag}", v5).connect()
    for qos in (0, 1, 2):
        pub.publish("py/s1/reading", f"{tag}-{qos}".encode(), qos)
        m = sub.message()
        if m.topic != "py/s1/reading" or m.payload != f"{tag}-{qos}".encode() or m.qos != qos:
            fail(f"got {m.topic} {m.payload!r} qos {m.qos} for qos {qos}")
    pub.stop()
    sub.stop()


def request_response():
    requester = Client("paho-requester", True).connect()
    requester.subscribe("py/replies/requester", 1)
    responder = Client("paho-responder", True).connect()
    responder.subscribe("py/requests", 1)

    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = "py/replies/requester"
    props.CorrelationData = b"\x00corr-42"
    props.UserProperty = [("op", "add"), ("n", "2")]
    props.ContentType = "text/plain"
    props.MessageExpiryInterval = 120
    requester.publish("py/requests", b"1+1", 1, props)

    req = responder.message()
    p = req.properties
    if p.ResponseTopic != "py/replies/requester" or p.CorrelationData != b"\x00corr-42":
        fail(f"request properties lost: {p}")
    if ("op", "add") not in p.UserProperty or p.ContentType != "text/plain":
        fail(f"user properties/content type lost: {p}")
    if not (0 < p.MessageExpiryInterval <= 120):
        fail(f"message expiry lost: {p}")
    reply = Properties(PacketTypes.PUBLISH)
    reply.CorrelationData = p.CorrelationData
    responder.publish(p.ResponseTopic, b"2", 1, reply)

    resp = requester.message()
    if resp.payload != b"2" or resp.properties.CorrelationData != b"\x00corr-42":
        fail(f"bad response {resp.payload!r} {resp.properties}")
    requester.stop()
    responder.stop()


def topic_alias():
    sub = Client("paho-alias-sub", True).connect()
    sub.subscribe("py/alias/#", 1)
    pub = Client("paho-alias-pub", True).connect()
    first = Properties(PacketTypes.PUBLISH)
    first.TopicAlias = 1
    pub.publish("py/alias/a/very/long/topic", b"one", 1, first)
    again = Properties(PacketTypes.PUBLISH)
    again.TopicAlias = 1
    pub.publish("", b"two", 1, again)
    for want in (b"one", b"two"):
        m = sub.message()
        if m.topic != "py/alias/a/very/long/topic" or m.payload != want:
            fail(f"got {m.topic} {m.payload!r}, want {want!r}")
    pub.stop()
    sub.stop()


def will():
    watcher = Client("paho-will-watcher", False).connect()
    watcher.subscribe("py/wills/#", 1)
    dying = Client("paho-dying", False)
    dying.c.will_set("py/wills/dying", b"lost", qos=1)
    dying.connect()
    # Drop the socket without DISCONNECT.
    dying.c.loop_stop()
    dying.c.socket().shutdown(socket.SHUT_RDWR)
    dying.c.socket().close()
    m = watcher.message()
    if m.topic != "py/wills/dying" or m.payload != b"lost":
        fail(f"got {m.topic} {m.payload!r}")
    watcher.stop()


def shared():
    members = [Client(f"paho-share-{i}", True).connect() for i in range(2)]
    for m in members:
        m.subscribe("$share/py/py/work/#", 1)
    pub = Client("paho-share-pub", True).connect()
    n = 30
    for i in range(n):
        pub.publish("py/work/item", str(i).encode(), 1)
    seen = []
    deadline = time.time() + WAIT
    while len(seen) < n and time.time() < deadline:
        for m in members:
            try:
                seen.append(m.messages.get(timeout=0.05).payload)
            except queue.Empty:
                pass
    if sorted(seen) != sorted(str(i).encode() for i in range(n)):
        fail(f"each message once to one member; got {len(seen)} ({len(set(seen))} distinct)")
    for m in members:
        m.stop()
    pub.stop()

# Topic names MQTT allows whose first level is no core topic name (issue #30):
# empty, a dot, `$`, UTF-8, a space, an empty level inside, and a long first level
# (cut and hashed) in a name near the broker's 31,743-byte limit.
LONG_NAME = "long." + "l" * 300 + "/" + "x" * 31000
# Over the 31,743 bytes the broker stores, within the test server's 32 KiB packets.
TOO_LONG = "a/" + "b" * 31800
ODD_NAMES = [
    "/devices/42/temp",
    "home.assistant/x",
    "$TopicA/B",
    "café/☕",
    "a//b",
    "my topic",
    LONG_NAME,
]


def take(client, n):
    """The next n messages of client as (topic, payload) pairs, any order."""
    got = []
    deadline = time.time() + WAIT
    while len(got) < n and time.time() < deadline:
        try:
            m = client.messages.get(timeout=0.05)
        except queue.Empty:
            continue
        got.append((m.topic, m.payload))
    return got


def short(name):
    return name if len(name) < 60 else f"{name[:40]}...({len(name)} bytes)"


def any_topic_name(v5):
    tag = "v5" if v5 else "v311"
    exact = Client(f"paho-names-exact-{tag}", v5).connect()
    for name in ODD_NAMES:
        exact.subscribe(name, 1)
    everything = Client(f"paho-names-all-{tag}", v5).connect()
    everything.subscribe("#", 1)
    devices = Client(f"paho-names-plus-{tag}", v5).connect()
    devices.subscribe("+/devices/#", 1)
    dollar = Client(f"paho-names-dollar-{tag}", v5).connect()
    dollar.subscribe("$TopicA/#", 1)
    pub = Client(f"paho-names-pub-{tag}", v5).connect()
    for name in ODD_NAMES:
        pub.publish(name, f"{tag}:{name[:20]}".encode(), 1)
    want = {(n, f"{tag}:{n[:20]}".encode()) for n in ODD_NAMES}
    got = take(exact, len(ODD_NAMES))
    if set(got) != want:
        fail(f"exact subscriptions got {sorted(short(t) for t, _ in got)}")
    # `#` sees every name but the one starting with `$` (MQTT-4.7.2-1); the
    # marker, published last on a plain topic, says the others had their chance.
    pub.publish("names/done", b"marker", 1)
    want_all = {(n, p) for n, p in want if not n.startswith("$")} | {("names/done", b"marker")}
    got = take(everything, len(want_all))
    if set(got) != want_all:
        fail(f"'#' got {sorted(short(t) for t, _ in got)}")
    try:
        extra = everything.messages.get(timeout=1)
        fail(f"'#' also got {short(extra.topic)}")
    except queue.Empty:
        pass
    got = take(devices, 1)
    if got != [("/devices/42/temp", f"{tag}:/devices/42/temp".encode())]:
        fail(f"'+/devices/#' got {got}")
    got = take(dollar, 1)
    if got != [("$TopicA/B", f"{tag}:$TopicA/B".encode())]:
        fail(f"'$TopicA/#' got {got}")
    for c in (exact, everything, devices, dollar, pub):
        c.stop()


def refusals_v311():
    """A 3.1.1 publish the broker does not take is acknowledged and dropped; the
    connection stays up. A wildcard in a PUBLISH name is malformed: closed."""
    sub = Client("paho-refused-sub", False).connect()
    sub.subscribe("#", 1)
    # The refused name itself ($SYS/# would also get the broker's own $SYS topics).
    sub.subscribe("$SYS/broker/fake", 1)
    pub = Client("paho-refused-pub", False).connect()
    pub.publish("$SYS/broker/fake", b"no", 1)
    pub.publish(TOO_LONG, b"too long", 1)
    pub.publish("after/refusals", b"still up", 1)
    got = take(sub, 1)
    if got != [("after/refusals", b"still up")]:
        fail(f"got {[(short(t), p) for t, p in got]}")
    try:
        extra = sub.messages.get(timeout=1)
        fail(f"a refused publish was delivered: {short(extra.topic)}")
    except queue.Empty:
        pass
    sub.stop()
    pub.stop()


def refusals_v5():
    """MQTT 5: each refusal is PUBACK 0x90 with a reason string."""
    reasons = queue.Queue()
    pub = Client("paho-refused-v5", True)
    pub.c.on_publish = lambda c, u, mid, rc, props: reasons.put((mid, rc, props))
    pub.connect()
    for name, why in [("$SYS/broker/fake", "$SYS/"), (TOO_LONG, "bytes")]:
        info = pub.c.publish(name, b"x", qos=1)
        try:
            mid, rc, props = reasons.get(timeout=WAIT)
        except queue.Empty:
            fail(f"no PUBACK for {short(name)}")
        if mid != info.mid or rc.value != 0x90:
            fail(f"{short(name)}: PUBACK {rc} for mid {mid}")
        text = getattr(props, "ReasonString", "") if props is not None else ""
        if why not in text:
            fail(f"{short(name)}: reason string {text!r}")
    pub.stop()


def fifo_shared(opt_in=True):
    """Three members of an ordered shared group ($share with user property
    order=fifo on SUBSCRIBE): every publisher's messages (one queue each) are
    acknowledged in publish order across the members, even though members take
    different times per message and the first to get its 5th message drops its
    connection holding it unacknowledged (it comes back to another member, first)."""
    keys, per_key = 4, 25
    lock = threading.Lock()
    acked = {k: [] for k in range(keys)}
    state = {"dropped": False}

    def member(i):
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"fifo-sub-{i}-{time.time_ns()}",
                        protocol=mqtt.MQTTv5, manual_ack=True)
        subacked = threading.Event()
        c.on_subscribe = lambda *a: subacked.set()
        dead = {"v": False}
        mine = {"n": 0}

        def on_message(cl, u, msg):
            if dead["v"]:
                return
            key, n = (int(x) for x in msg.payload.decode().split(":"))
            mine["n"] += 1
            with lock:
                drop = not state["dropped"] and mine["n"] >= 5
                if drop:
                    state["dropped"] = True
            if drop:
                # Holds this one unacknowledged and goes away: a "timeout".
                dead["v"] = True
                threading.Thread(target=lambda: (cl.disconnect(), cl.loop_stop())).start()
                return
            time.sleep(0.003 * ((n + i) % 3))  # "processing": members differ in pace
            with lock:
                acked[key].append(n)
            cl.ack(msg.mid, msg.qos)

        c.on_message = on_message
        c.connect(HOST, PORT, keepalive=30, clean_start=True)
        c.loop_start()
        props = Properties(PacketTypes.SUBSCRIBE)
        if opt_in:
            props.UserProperty = ("order", "fifo")
        c.subscribe("$share/ordered/fifo/#", 1, properties=props)
        if not subacked.wait(WAIT):
            fail(f"member {i}: no SUBACK")
        return c

    members = [member(i) for i in range(3)]
    pubs = [Client(f"fifo-pub-{k}", True).connect() for k in range(keys)]
    for n in range(per_key):
        for k, p in enumerate(pubs):
            p.publish(f"fifo/k{k}", f"{k}:{n}".encode(), 1)
    deadline = time.time() + WAIT
    while time.time() < deadline:
        with lock:
            if all(len(a) >= per_key for a in acked.values()):
                break
        time.sleep(0.05)
    if not state["dropped"]:
        fail("no member got a 5th message")
    for k, a in acked.items():
        # QoS 1 is at-least-once: a message whose PUBACK was still on its way when
        # its member dropped comes again; order means no step back past that.
        once = [n for i, n in enumerate(a) if i == 0 or n != a[i - 1]]
        if once != list(range(per_key)):
            fail(f"key {k} acknowledged in the order {a}")
    for p in pubs:
        p.stop()
    for c in members:
        if c.is_connected():
            c.disconnect()
            c.loop_stop()


def shared_start():
    """Where a new shared group starts: at the oldest stored message by default;
    SUBSCRIBE user property start = latest / a time in ms moves a new group; a bad
    value is refused (SUBACK 0x83)."""
    pub = Client("start-pub", True).connect()
    for i in range(3):
        pub.publish("starts/x", f"old-{i}".encode(), 1)
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    pub.publish("starts/x", b"mid", 1)

    def member(group, start):
        c = Client(f"start-{group}", True)
        c.c.on_subscribe = lambda cl, u, mid, rcs, props: c.events.put(("suback", mid, rcs))
        c.connect()
        props = Properties(PacketTypes.SUBSCRIBE)
        if start is not None:
            props.UserProperty = ("start", start)
        c.c.subscribe(f"$share/{group}/starts/#", 1, properties=props)
        return c, c.wait("suback")[2]

    def drain(c, n):
        got = []
        for _ in range(n):
            got.append(c.message().payload.decode())
        try:
            extra = c.messages.get(timeout=0.5)
            fail(f"unexpected {extra.payload!r}")
        except queue.Empty:
            pass
        return got

    plain, _ = member("plain", None)
    got = drain(plain, 4)
    if sorted(got) != ["mid", "old-0", "old-1", "old-2"]:
        fail(f"default start got {got}")
    tail, _ = member("tail", "latest")
    since, _ = member("since", str(cut))
    bad, rcs = member("bad", "yesterday")
    if rcs[0].value != 0x83:
        fail(f"start=yesterday: SUBACK {rcs}")
    if drain(since, 1) != ["mid"]:
        fail("start=<ms> did not start at the cut")
    pub.publish("starts/x", b"new", 1)
    if drain(tail, 1) != ["new"]:
        fail("start=latest got old messages")
    for c in (pub, plain, tail, since, bad):
        c.stop()


SCENARIOS = {
    "shared-start": shared_start,
    "fifo-shared": fifo_shared,
    "concurrent-shared": lambda: fifo_shared(False),
    "qos-v311": lambda: every_qos(False),
    "qos-v5": lambda: every_qos(True),
    "request-response": request_response,
    "topic-alias": topic_alias,
    "will": will,
    "shared": shared,
    "names-v311": lambda: any_topic_name(False),
    "names-v5": lambda: any_topic_name(True),
    "refusals-v311": refusals_v311,
    "refusals-v5": refusals_v5,
}

if __name__ == "__main__":
    SCENARIOS[SCENARIO]()
    print(f"ok {SCENARIO}")
