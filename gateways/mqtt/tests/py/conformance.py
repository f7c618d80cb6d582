"""MQTT conformance suite, organised by normative statement.

Usage: conformance.py HOST PORT [--only NAME,...] [--node default|ska|auth] [--table]

Every case names the statements of MQTT 3.1.1 ("3:MQTT-x.y.z-n") and MQTT 5.0
("5:MQTT-x.y.z-n") it checks, and drives the broker through the socket: with
Eclipse Paho (paho-mqtt 2.x), with Mosquitto's clients (mosquitto_pub/_sub)
where the case says so, and with raw packets where a statement is about bad
input no real client sends. The cases run concurrently (each on its own topics
and client ids) against one broker, so the whole suite takes about as long as
its slowest case. Exit status 0 when every case passed.

`--node ska` runs the cases that need a broker started with
`mqtt.server_keep_alive = "2s"` (Server Keep Alive), and only those;
`--node auth` the enhanced-authentication (AUTH, SCRAM-SHA-256) cases, which
need `auth.enabled` and a user `cf-scram` with password `cf-scram-pw` set since
SCRAM support (so it has SCRAM keys) and the `admin` role.
`--table` prints the statement table of docs/mqtt.md "Conformance" instead.

Run by gateways/mqtt/tests/conformance.rs; by hand against any broker:
    python3 conformance.py 127.0.0.1 1883
"""

import base64
import hashlib
import hmac
import json
import os
import queue
import random
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

WAIT = 10
CASES = []


class Failed(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failed(msg)


def case(*statements, node="default", clients="paho"):
    """Registers a case: the statements it checks, the broker it needs, the clients it uses."""

    def deco(f):
        CASES.append({"name": f.__name__, "fn": f, "statements": statements, "node": node,
                      "clients": clients, "doc": (f.__doc__ or "").strip().split("\n")[0]})
        return f

    return deco


# ---------------------------------------------------------------------------
# A paho client whose callbacks feed queues a case waits on.


class Client:
    def __init__(self, host, port, cid, v5=True, manual_ack=False):
        self.host, self.port, self.v5 = host, port, v5
        proto = mqtt.MQTTv5 if v5 else mqtt.MQTTv311
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, protocol=proto,
                             manual_ack=manual_ack, reconnect_on_failure=False)
        self.messages = queue.Queue()
        self.events = queue.Queue()
        self.disconnects = queue.Queue()
        self.c.on_connect = lambda c, u, flags, rc, props: self.events.put(("connack", rc, flags, props))
        self.c.on_subscribe = lambda c, u, mid, rcs, props: self.events.put(("suback", mid, rcs, props))
        self.c.on_unsubscribe = lambda c, u, mid, rcs, props: self.events.put(("unsuback", mid, rcs, props))
        self.c.on_publish = lambda c, u, mid, rc, props: self.events.put(("puback", mid, rc, props))
        self.c.on_message = lambda c, u, msg: self.messages.put(msg)
        self.c.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.put((rc, props))

    def connect(self, clean=True, props=None, keepalive=30):
        """Connects and returns (reason code, session present, CONNACK properties)."""
        if self.v5:
            self.c.connect(self.host, self.port, keepalive=keepalive, clean_start=clean, properties=props)
        else:
            self.c._clean_session = clean
            self.c.connect(self.host, self.port, keepalive=keepalive)
        self.c.loop_start()
        ev = self.wait("connack")
        return ev[1], ev[2].session_present, ev[3]

    def wait(self, kind, timeout=WAIT):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                ev = self.events.get(timeout=max(0.01, deadline - time.time()))
            except queue.Empty:
                break
            if ev[0] == kind:
                return ev
        raise Failed(f"no {kind} in time")

    def subscribe(self, topic, qos=1, props=None, **opts):
        if self.v5:
            self.c.subscribe(topic, options=SubscribeOptions(qos=qos, **opts), properties=props)
        else:
            self.c.subscribe(topic, qos)
        return self.wait("suback")[2]

    def publish(self, topic, payload, qos=1, props=None, retain=False):
        info = self.c.publish(topic, payload, qos=qos, retain=retain, properties=props)
        if qos > 0:
            info.wait_for_publish(timeout=WAIT)
            check(info.is_published(), f"publish to {topic} not acknowledged")
        return info

    def message(self, timeout=WAIT):
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise Failed("no message in time")

    def take(self, n, timeout=WAIT):
        got = []
        deadline = time.time() + timeout
        while len(got) < n and time.time() < deadline:
            try:
                got.append(self.messages.get(timeout=0.05))
            except queue.Empty:
                pass
        check(len(got) == n, f"{len(got)} of {n} messages: {[(m.topic, m.payload) for m in got]}")
        return got

    def nothing(self, wait=0.7):
        try:
            m = self.messages.get(timeout=wait)
        except queue.Empty:
            return
        raise Failed(f"unexpected message {m.topic} {m.payload!r} retain={m.retain}")

    def disconnected(self, timeout=WAIT):
        try:
            return self.disconnects.get(timeout=timeout)
        except queue.Empty:
            raise Failed("not disconnected in time")

    def drop(self):
        """Ends the connection without DISCONNECT (as a network failure would)."""
        self.c.loop_stop()
        s = self.c.socket()
        if s is not None:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def stop(self, props=None, reason=None):
        if reason is not None:
            self.c.disconnect(reasoncode=reason, properties=props)
        else:
            self.c.disconnect(properties=props)
        self.c.loop_stop()


def props(kind, **kw):
    p = Properties(kind)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


# ---------------------------------------------------------------------------
# Raw packets, for statements about input no real client sends.


def varint(n):
    out = bytearray()
    while True:
        b = n % 128
        n //= 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def s16(b):
    if isinstance(b, str):
        b = b.encode()
    return struct.pack(">H", len(b)) + b


def packet(first, body):
    return bytes([first]) + varint(len(body)) + body


def connect_packet(cid, level=5, flags=0x02, keepalive=30, name="MQTT", props=b"", will=None, tail=b""):
    """A CONNECT; `will` = (topic, payload) sets the will fields (the flags are the caller's)."""
    body = s16(name) + bytes([level, flags]) + struct.pack(">H", keepalive)
    if level == 5:
        body += varint(len(props)) + props
    body += s16(cid)
    if will is not None:
        if level == 5:
            body += varint(0)
        body += s16(will[0]) + s16(will[1])
    return packet(0x10, body + tail)


def publish_packet(topic, payload, qos=0, pkid=1, v5=True, first=None, props=b""):
    body = s16(topic)
    if qos:
        body += struct.pack(">H", pkid)
    if v5:
        body += varint(len(props)) + props
    return packet(first if first is not None else 0x30 | (qos << 1), body + payload)


class Raw:
    def __init__(self, host, port):
        self.s = socket.create_connection((host, port), timeout=WAIT)
        self.buf = b""

    def send(self, b):
        self.s.sendall(b)

    def recv(self, timeout=WAIT):
        """The next packet as (type, flags, body), or None when the server closed."""
        self.s.settimeout(timeout)
        while True:
            p = self._parse()
            if p is not None:
                return p
            try:
                chunk = self.s.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                return None
            except socket.timeout:
                raise Failed("no packet and no close in time")
            if not chunk:
                return None
            self.buf += chunk

    def _parse(self):
        if len(self.buf) < 2:
            return None
        n, mult, i = 0, 1, 1
        while True:
            if i >= len(self.buf):
                return None
            b = self.buf[i]
            n += (b & 0x7F) * mult
            mult *= 128
            i += 1
            if not b & 0x80:
                break
        if len(self.buf) < i + n:
            return None
        first, body = self.buf[0], self.buf[i:i + n]
        self.buf = self.buf[i + n:]
        return first >> 4, first & 0x0F, body

    def closed(self, timeout=WAIT):
        """Reads until the server closes; the packets it sent before."""
        got = []
        while True:
            p = self.recv(timeout)
            if p is None:
                return got
            got.append(p)

    def close(self):
        self.s.close()


def connected_raw(h, p, cid, level=5, **kw):
    r = Raw(h, p)
    r.send(connect_packet(cid, level=level, **kw))
    ack = r.recv()
    check(ack is not None and ack[0] == 2, f"CONNACK expected, got {ack}")
    check(ack[2][0] in (0, 1), f"reserved CONNACK flags set: {ack}")
    rc = ack[2][1]
    check(rc == 0, f"CONNECT refused: {rc:#x}")
    return r


def reason_of(pkts, kind=14):
    """The reason code of the first packet of `kind` (DISCONNECT by default) in pkts."""
    for t, _, body in pkts:
        if t == kind:
            return body[0] if body else 0
    return None


# ---------------------------------------------------------------------------
# Mosquitto's command-line clients.


def mosquitto_sub(h, p, args, count=1, timeout=WAIT):
    """Starts mosquitto_sub; returns the process (its output is read by `collect`)."""
    proc = subprocess.Popen(["mosquitto_sub", "-h", h, "-p", str(p), "-C", str(count), "-W", str(timeout)]
                            + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # let it subscribe
    return proc


def collect(proc):
    out, err = proc.communicate(timeout=WAIT + 5)
    return out, err


def mosquitto_pub(h, p, args):
    r = subprocess.run(["mosquitto_pub", "-h", h, "-p", str(p)] + args, capture_output=True, text=True,
                       timeout=WAIT)
    check(r.returncode == 0, f"mosquitto_pub failed: {r.stderr}")


# ===========================================================================
# CONNECT


@case("3:MQTT-3.1.0-1", "5:MQTT-3.1.0-1", clients="raw")
def first_packet_must_be_connect(h, p, t):
    """A PINGREQ before CONNECT: closed with nothing sent."""
    for _ in (4, 5):
        r = Raw(h, p)
        r.send(packet(0xC0, b""))
        got = r.closed()
        check(got == [], f"the server answered {got}")


@case("3:MQTT-3.1.0-2", "5:MQTT-3.1.0-2", "5:MQTT-3.2.0-2", "5:MQTT-3.14.2-1", clients="raw")
def second_connect_is_a_protocol_error(h, p, t):
    """A second CONNECT: 3.1.1 closed; 5 DISCONNECT 0x82 then closed, no second CONNACK."""
    r = connected_raw(h, p, f"{t}-4", level=4)
    r.send(connect_packet(f"{t}-4", level=4))
    got = r.closed()
    check(got == [], f"3.1.1 got {got}")
    r = connected_raw(h, p, f"{t}-5")
    r.send(connect_packet(f"{t}-5"))
    got = r.closed()
    check([x[0] for x in got] == [14] and reason_of(got) == 0x82, f"5 got {got}")
    check(b"\x1f" in got[0][2], f"DISCONNECT without a reason string: {got}")


@case("3:MQTT-3.1.2-1", "5:MQTT-3.1.2-1", "3:MQTT-3.1.4-1", "5:MQTT-3.1.4-1", clients="raw")
def wrong_protocol_name_closes(h, p, t):
    """Protocol name "MQTX": closed (a v5 server may say CONNACK 0x84 first)."""
    for level in (4, 5):
        r = Raw(h, p)
        r.send(connect_packet(t, level=level, name="MQTX"))
        got = r.closed()
        check(all(x[0] == 2 and x[2][1] in (0x01, 0x84) for x in got), f"level {level}: got {got}")


@case("3:MQTT-3.1.2-2", "5:MQTT-3.1.2-2", "3:MQTT-3.2.2-4", "3:MQTT-3.2.2-5", "5:MQTT-3.2.2-6",
      "5:MQTT-3.2.2-7", clients="raw")
def unsupported_level_gets_connack_and_close(h, p, t):
    """Level 3 (MQTT 3.1): CONNACK 0x01, session present 0, closed; level 6: CONNACK 0x84, closed."""
    r = Raw(h, p)
    r.send(connect_packet(t, level=3, name="MQIsdp"))
    got = r.closed()
    check(len(got) == 1 and got[0][0] == 2 and got[0][2][:2] == b"\x00\x01", f"level 3: {got}")
    r = Raw(h, p)
    r.send(connect_packet(t, level=6))
    got = r.closed()
    check(len(got) == 1 and got[0][0] == 2 and got[0][2][:2] == b"\x00\x84", f"level 6: {got}")


@case("3:MQTT-3.1.2-3", "5:MQTT-3.1.2-3", "5:MQTT-3.14.0-1", clients="raw")
def reserved_connect_flag_closes(h, p, t):
    """Connect flags bit 0 set: closed, no DISCONNECT before a CONNACK."""
    for level in (4, 5):
        r = Raw(h, p)
        r.send(connect_packet(t, level=level, flags=0x03))
        got = r.closed()
        check(all(x[0] == 2 and x[2][1] >= 0x80 for x in got), f"level {level}: got {got}")


@case("3:MQTT-3.1.2-11", "3:MQTT-3.1.2-14", "3:MQTT-3.1.2-15", "5:MQTT-3.1.2-11", "5:MQTT-3.1.2-12",
      "5:MQTT-3.1.2-13", "3:MQTT-3.1.2-22", "3:MQTT-3.1.2-9", "5:MQTT-3.1.2-9", "3:MQTT-3.1.2-19",
      "5:MQTT-3.1.2-17", "3:MQTT-3.1.2-21", "5:MQTT-3.1.2-19", "3:MQTT-3.1.4-1", "5:MQTT-3.1.4-1", clients="raw")
def bad_will_and_credential_flags_close(h, p, t):
    """Will QoS or retain without the will flag, will QoS 3, a password without a user name (3.1.1), a will,
    user name or password flag without its field: closed (5: CONNACK 0x81 first)."""
    bad = [
        (4, 0x02 | 0x08, None),  # will QoS 1, no will flag
        (4, 0x02 | 0x20, None),  # will retain, no will flag
        (4, 0x02 | 0x04 | 0x18, ("w", "x")),  # will QoS 3
        (4, 0x02 | 0x40, None),  # password flag without user name flag (3.1.1)
        (5, 0x02 | 0x08, None),
        (5, 0x02 | 0x20, None),
        (5, 0x02 | 0x04 | 0x18, ("w", "x")),
    ]
    for level in (4, 5):
        bad += [
            (level, 0x02 | 0x04, None),  # will flag, no will fields
            (level, 0x02 | 0x80, None),  # user name flag, no user name
            (level, 0x02 | 0xC0, "user"),  # password flag, no password
        ]
    for level, flags, will in bad:
        r = Raw(h, p)
        tail = b""
        if will == "user":
            will, tail = None, s16("user")
        elif flags & 0x40 and not flags & 0x80:
            tail = s16("pw")
        r.send(connect_packet(t, level=level, flags=flags, will=will, tail=tail))
        got = r.closed()
        check(all(x[0] == 2 and x[2][1] >= 0x80 for x in got), f"level {level} flags {flags:#x}: got {got}")


@case("3:MQTT-3.1.2-6", "3:MQTT-3.1.2-4", "3:MQTT-3.1.2-5", "3:MQTT-3.2.2-1", "3:MQTT-3.2.2-2",
      "3:MQTT-3.2.2-3", "3:MQTT-3.1.3-2", "3:MQTT-3.1.4-3", "3:MQTT-3.1.4-4")
def clean_session_v311(h, p, t):
    """3.1.1: clean session 0 resumes subscriptions and stores QoS 1/2 while away; 1 discards them."""
    c = Client(h, p, f"{t}-c", v5=False)
    rc, present, _ = c.connect(clean=False)
    check(rc == 0 and not present, "first persistent connect: session present")
    c.subscribe(f"{t}/x", 1)
    c.stop()
    pub = Client(h, p, f"{t}-p", v5=False)
    pub.connect()
    pub.publish(f"{t}/x", b"while away", 1)
    c = Client(h, p, f"{t}-c", v5=False)
    rc, present, _ = c.connect(clean=False)
    check(present, "session present expected on resume")
    m = c.message()
    check(m.payload == b"while away", f"got {m.payload!r}")
    c.stop()
    c = Client(h, p, f"{t}-c", v5=False)
    rc, present, _ = c.connect(clean=True)
    check(rc == 0 and not present, "clean session: session present set")
    c.stop()
    pub.publish(f"{t}/x", b"after clean", 1)
    c = Client(h, p, f"{t}-c", v5=False)
    rc, present, _ = c.connect(clean=False)
    check(not present, "the clean session left a session behind")
    c.nothing()
    c.stop()
    pub.stop()


@case("5:MQTT-3.1.2-4", "5:MQTT-3.1.2-5", "5:MQTT-3.1.2-6", "5:MQTT-3.1.2-23", "5:MQTT-3.2.2-2",
      "5:MQTT-3.2.2-3", "5:MQTT-3.1.4-4", "5:MQTT-3.1.4-5")
def clean_start_and_session_expiry_v5(h, p, t):
    """5: session kept for its expiry interval (CONNECT or DISCONNECT), not at 0, gone after it."""
    cid = f"{t}-c"
    exp = lambda s: props(PacketTypes.CONNECT, SessionExpiryInterval=s)
    c = Client(h, p, cid)
    rc, present, _ = c.connect(clean=True, props=exp(0))
    check(rc == 0 and not present, "clean start: session present")
    c.subscribe(f"{t}/x")
    c.stop()
    c = Client(h, p, cid)
    _, present, _ = c.connect(clean=False, props=exp(0))
    check(not present, "expiry 0: the session outlived the connection")
    c.stop()
    c = Client(h, p, cid)
    c.connect(clean=True, props=exp(2))
    c.subscribe(f"{t}/x")
    c.stop()
    pub = Client(h, p, f"{t}-p")
    pub.connect()
    pub.publish(f"{t}/x", b"queued", 1)
    c = Client(h, p, cid)
    _, present, _ = c.connect(clean=False, props=exp(1))
    check(present, "expiry 2: session gone after a moment")
    check(c.message().payload == b"queued", "queued message not delivered")
    # DISCONNECT changes the interval: 1 -> 30 keeps it past 1 s.
    c.stop(props=props(PacketTypes.DISCONNECT, SessionExpiryInterval=30))
    time.sleep(1.5)
    c = Client(h, p, cid)
    _, present, _ = c.connect(clean=False, props=exp(1))
    check(present, "DISCONNECT's session expiry 30 not applied")
    c.stop(props=props(PacketTypes.DISCONNECT, SessionExpiryInterval=0))
    c = Client(h, p, cid)
    _, present, _ = c.connect(clean=False, props=exp(1))
    check(not present, "DISCONNECT's session expiry 0 not applied")
    c.stop()
    time.sleep(2.5)
    c = Client(h, p, cid)
    _, present, _ = c.connect(clean=False, props=exp(0))
    check(not present, "session present after its expiry interval")
    c.stop()
    pub.stop()


@case("5:MQTT-3.14.2-1", clients="raw")
def session_expiry_on_disconnect_after_zero_is_a_protocol_error(h, p, t):
    """5: DISCONNECT with a session expiry after CONNECT with 0: the server answers DISCONNECT 0x82."""
    r = connected_raw(h, p, t)
    pr = bytes([0x11]) + struct.pack(">I", 60)
    r.send(packet(0xE0, bytes([0x00]) + varint(len(pr)) + pr))
    got = r.closed()
    check(reason_of(got) == 0x82, f"got {got}")


@case("3:MQTT-3.1.3-5", "5:MQTT-3.1.3-5", "3:MQTT-3.1.4-4", "5:MQTT-3.1.4-5")
def client_ids_of_23_alphanumerics(h, p, t):
    """Client ids of 1 to 23 of [0-9a-zA-Z] are accepted (and longer ones too)."""
    for v5 in (False, True):
        for cid in ("a", "0123456789abcdefghijKLM", "a-longer-client-id-than-23-bytes-" + t):
            c = Client(h, p, cid + ("5" if v5 else "4"), v5=v5)
            rc, _, _ = c.connect()
            check(rc == 0, f"{cid}: {rc}")
            c.stop()


@case("3:MQTT-3.1.3-6", "3:MQTT-3.1.3-8", "5:MQTT-3.1.3-6", "5:MQTT-3.1.3-7", clients="raw+paho")
def zero_length_client_id(h, p, t):
    """Empty id: 3.1.1 accepted with clean session, CONNACK 0x02 without; 5 gets an Assigned Client Identifier."""
    r = Raw(h, p)
    r.send(connect_packet("", level=4, flags=0x00))
    got = r.closed()
    check(len(got) == 1 and got[0][2] == b"\x00\x02", f"3.1.1 persistent empty id: {got}")
    c = Client(h, p, "", v5=False)
    rc, present, _ = c.connect(clean=True)
    check(rc == 0 and not present, f"3.1.1 clean empty id: {rc}")
    c.stop()
    ids = set()
    for clean in (True, False):
        c = Client(h, p, "", v5=True)
        rc, _, pr = c.connect(clean=clean)
        aid = getattr(pr, "AssignedClientIdentifier", "")
        check(rc == 0 and aid, f"5 clean={clean}: rc {rc}, assigned {aid!r}")
        ids.add(aid)
        c.stop()
    check(len(ids) == 2, "the same id assigned twice")
    c = Client(h, p, f"{t}-named")
    _, _, pr = c.connect()
    check(not hasattr(pr, "AssignedClientIdentifier"), "an id was assigned to a client that had one")
    c.stop()


@case("3:MQTT-3.1.4-2", "5:MQTT-3.1.4-3", "5:MQTT-3.14.2-2")
def session_takeover(h, p, t):
    """A second connection with the same id closes the first (5: DISCONNECT 0x8E) and takes its session."""
    for v5 in (False, True):
        cid = f"{t}-{int(v5)}"
        a = Client(h, p, cid, v5=v5)
        a.connect(clean=False, props=props(PacketTypes.CONNECT, SessionExpiryInterval=60) if v5 else None)
        a.subscribe(f"{t}/{int(v5)}", 1)
        b = Client(h, p, cid, v5=v5)
        _, present, _ = b.connect(clean=False, props=props(PacketTypes.CONNECT, SessionExpiryInterval=60) if v5 else None)
        rc, pr = a.disconnected()
        if v5:
            check(rc.value == 0x8E, f"old connection got {rc}")
            check(not hasattr(pr, "SessionExpiryInterval"), "server DISCONNECT carries a session expiry")
        check(present, "the new connection did not get the session")
        pub = Client(h, p, f"{cid}-p", v5=v5)
        pub.connect()
        pub.publish(f"{t}/{int(v5)}", b"to b", 1)
        check(b.message().payload == b"to b", "the taken-over subscription did not deliver")
        a.c.loop_stop()
        b.stop(props=props(PacketTypes.DISCONNECT, SessionExpiryInterval=0) if v5 else None)
        pub.stop()


# ---------------------------------------------------------------------------
# Wills and keep-alive


def will_watch(h, p, t, v5=True):
    w = Client(h, p, f"{t}-watch", v5=v5)
    w.connect()
    w.subscribe(f"{t}/will/#", 1)
    return w


@case("3:MQTT-3.1.2-8", "3:MQTT-3.1.2-9", "3:MQTT-3.1.2-16", "5:MQTT-3.1.2-7", "5:MQTT-3.1.2-8",
      "5:MQTT-3.1.2-9", "5:MQTT-3.1.2-14", "5:MQTT-3.1.3-10")
def will_on_network_drop(h, p, t):
    """A connection dropped without DISCONNECT: its will is published (not retained), with its properties."""
    for v5 in (False, True):
        w = will_watch(h, p, f"{t}{int(v5)}", v5)
        d = Client(h, p, f"{t}-dying{int(v5)}", v5=v5)
        wp = props(PacketTypes.WILLMESSAGE, UserProperty=[("z", "1"), ("a", "2"), ("z", "0")],
                   ContentType="text/plain") if v5 else None
        d.c.will_set(f"{t}{int(v5)}/will/d", b"gone", qos=1, properties=wp)
        d.connect()
        d.drop()
        m = w.message()
        check(m.payload == b"gone" and not m.retain, f"got {m.payload!r} retain={m.retain}")
        if v5:
            check(m.properties.UserProperty == [("z", "1"), ("a", "2"), ("z", "0")],
                  f"user properties {m.properties.UserProperty}")
            check(m.properties.ContentType == "text/plain", "content type lost")
        w.stop()


@case("3:MQTT-3.1.2-17", "5:MQTT-3.1.2-15")
def will_retain(h, p, t):
    """A will with the retain flag is published retained: a later subscriber gets it."""
    for v5 in (False, True):
        d = Client(h, p, f"{t}-d{int(v5)}", v5=v5)
        d.c.will_set(f"{t}/will/{int(v5)}", b"retained will", qos=1, retain=True)
        d.connect()
        w = will_watch(h, p, f"{t}-early{int(v5)}", v5)
        d.drop()
        time.sleep(0.5)
        late = Client(h, p, f"{t}-late{int(v5)}", v5=v5)
        late.connect()
        late.subscribe(f"{t}/will/{int(v5)}", 1)
        m = late.message()
        check(m.payload == b"retained will" and m.retain, f"got {m.payload!r} retain={m.retain}")
        late.publish(f"{t}/will/{int(v5)}", b"", 1, retain=True)
        late.stop()
        w.stop()


@case("3:MQTT-3.1.2-10", "3:MQTT-3.14.4-3", "5:MQTT-3.1.2-10", "5:MQTT-3.14.4-3")
def no_will_after_disconnect(h, p, t):
    """DISCONNECT (5: reason 0x00) discards the will."""
    for v5 in (False, True):
        w = will_watch(h, p, f"{t}{int(v5)}", v5)
        d = Client(h, p, f"{t}-d{int(v5)}", v5=v5)
        d.c.will_set(f"{t}{int(v5)}/will/d", b"must not", qos=1)
        d.connect()
        d.stop()
        w.nothing(1.0)
        w.stop()


@case("5:MQTT-3.1.2-8")
def will_on_disconnect_with_will_message(h, p, t):
    """5: DISCONNECT 0x04 (Disconnect with Will Message) publishes the will."""
    w = will_watch(h, p, t)
    d = Client(h, p, f"{t}-d")
    d.c.will_set(f"{t}/will/d", b"asked for", qos=1)
    d.connect()
    d.stop(reason=mqtt.ReasonCode(PacketTypes.DISCONNECT, identifier=4))
    check(w.message().payload == b"asked for", "no will")
    w.stop()


@case("3:MQTT-3.1.2-8", "5:MQTT-3.1.2-8", clients="raw+paho")
def will_on_protocol_error(h, p, t):
    """A protocol error (a second CONNECT) ends the connection and publishes the will."""
    for level in (4, 5):
        w = will_watch(h, p, f"{t}{level}", level == 5)
        r = connected_raw(h, p, f"{t}-d{level}", level=level, flags=0x02 | 0x04 | 0x08,
                          will=(f"{t}{level}/will/d", "broken"))
        r.send(connect_packet(f"{t}-d{level}", level=level))
        r.closed()
        check(w.message().payload == b"broken", "no will")
        w.stop()


@case("3:MQTT-3.1.2-24", "5:MQTT-3.1.2-22", "5:MQTT-3.2.2-22", "3:MQTT-3.1.2-8", clients="raw+paho")
def keep_alive_expiry_closes_and_publishes_will(h, p, t):
    """Keep-alive 1 s and silence: closed within 1.5 s (+ the server's 1 s tick) and the will published."""
    for v5 in (False, True):
        w = will_watch(h, p, f"{t}{int(v5)}", v5)
        r = connected_raw(h, p, f"{t}-d{int(v5)}", level=5 if v5 else 4, keepalive=1,
                          flags=0x02 | 0x04 | 0x08, will=(f"{t}{int(v5)}/will/d", "silent"))
        start = time.time()
        got = r.closed(timeout=6)
        took = time.time() - start
        # 1.5 s, checked on the server's 1 s tick; slack for a loaded machine.
        check(1.4 <= took <= 4.0, f"closed after {took:.1f} s")
        if v5:
            check(reason_of(got) == 0x8D, f"v5 got {got}")
        check(w.message().payload == b"silent", "no will")
        w.stop()


@case("3:MQTT-3.12.4-1", "5:MQTT-3.12.4-1", "5:MQTT-3.2.2-22", "3:MQTT-3.2.0-1", "5:MQTT-3.2.0-1",
      "5:MQTT-3.2.2-1", clients="raw")
def pings_keep_the_connection_and_get_pingresp(h, p, t):
    """PINGREQ gets PINGRESP; a client pinging every second with keep-alive 1 stays connected."""
    for level in (4, 5):
        r = connected_raw(h, p, f"{t}-{level}", level=level, keepalive=1)
        for _ in range(4):
            time.sleep(0.8)
            r.send(packet(0xC0, b""))
            got = r.recv()
            check(got is not None and got[0] == 13, f"level {level}: {got}")
        r.close()


@case("3:MQTT-3.1.2-24", "5:MQTT-3.1.2-22", clients="raw")
def keep_alive_zero_is_off(h, p, t):
    """Keep-alive 0: a silent connection stays up."""
    r = connected_raw(h, p, t, keepalive=0)
    time.sleep(2.5)
    r.send(packet(0xC0, b""))
    got = r.recv()
    check(got is not None and got[0] == 13, f"got {got}")
    r.close()


@case("5:MQTT-3.1.3-9", "5:MQTT-3.1.2-8")
def will_delay_interval(h, p, t):
    """5: a will with a delay is published after the delay; not at all when the client is back in time."""
    w = will_watch(h, p, t)
    cp = props(PacketTypes.CONNECT, SessionExpiryInterval=30)
    d = Client(h, p, f"{t}-late")
    d.c.will_set(f"{t}/will/late", b"delayed", qos=1, properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=2))
    d.connect(props=cp)
    back = Client(h, p, f"{t}-back")
    back.c.will_set(f"{t}/will/back", b"must not", qos=1,
                    properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=2))
    back.connect(props=cp)
    start = time.time()
    d.drop()
    back.drop()
    time.sleep(0.5)
    again = Client(h, p, f"{t}-back")
    _, present, _ = again.connect(clean=False, props=cp)
    check(present, "session lost")
    m = w.message()
    took = time.time() - start
    check(m.topic == f"{t}/will/late" and 1.5 <= took <= 4.5, f"{m.topic} after {took:.1f} s")
    w.nothing(1.0)
    again.stop(props=props(PacketTypes.DISCONNECT, SessionExpiryInterval=0))
    w.stop()


@case("5:MQTT-3.1.2-8")
def will_at_session_end_before_delay(h, p, t):
    """5: session expiry 1 s, will delay 30 s: the will goes out when the session ends."""
    w = will_watch(h, p, t)
    d = Client(h, p, f"{t}-d")
    d.c.will_set(f"{t}/will/d", b"session ended", qos=1,
                 properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=30))
    d.connect(props=props(PacketTypes.CONNECT, SessionExpiryInterval=1))
    start = time.time()
    d.drop()
    m = w.message()
    took = time.time() - start
    check(m.payload == b"session ended" and 0.5 <= took <= 3.5, f"after {took:.1f} s")
    w.stop()


@case("5:MQTT-3.1.2-8", "5:MQTT-3.1.2-4")
def delayed_will_sent_when_a_clean_start_ends_the_session(h, p, t):
    """5: will delay 30 s, session expiry 60 s: the client comes back with Clean Start, which ends the old
    session, so its will goes out then, not 30 s later."""
    w = will_watch(h, p, t)
    d = Client(h, p, f"{t}-d")
    d.c.will_set(f"{t}/will/d", b"old session ended", qos=1,
                 properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=30))
    d.connect(props=props(PacketTypes.CONNECT, SessionExpiryInterval=60))
    d.drop()
    time.sleep(0.3)
    w.nothing(0.5)
    again = Client(h, p, f"{t}-d")
    start = time.time()
    _, present, _ = again.connect(clean=True)
    check(not present, "clean start resumed the session")
    m = w.message(timeout=5)
    check(m.payload == b"old session ended" and time.time() - start < 3, "will not sent at session end")
    again.stop()
    w.stop()


@case("5:MQTT-3.1.3-9", "5:MQTT-3.1.4-3")
def delayed_will_not_sent_on_takeover(h, p, t):
    """5: a new connection taking the session over before the delay: the will is not sent."""
    w = will_watch(h, p, t)
    cp = props(PacketTypes.CONNECT, SessionExpiryInterval=30)
    a = Client(h, p, f"{t}-d")
    a.c.will_set(f"{t}/will/d", b"must not", qos=1, properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=2))
    a.connect(props=cp)
    b = Client(h, p, f"{t}-d")
    b.connect(clean=False, props=cp)
    rc, _ = a.disconnected()
    check(rc.value == 0x8E, f"old connection got {rc}")
    w.nothing(3.0)
    b.stop(props=props(PacketTypes.DISCONNECT, SessionExpiryInterval=0))
    w.stop()


@case("5:MQTT-3.1.2-21", "5:MQTT-3.2.2-21", "3:MQTT-3.1.2-24", node="ska", clients="raw+paho")
def server_keep_alive_overrides(h, p, t):
    """Broker with server_keep_alive 2 s: CONNACK says Server Keep Alive 2 to a v5 client asking 60, 0 or 1
    and the server enforces it (closed after 3 s of silence, 0x8D, will published); one asking 2 is not
    told; a 3.1.1 client (which cannot be told) keeps its own 60."""
    w = will_watch(h, p, t)
    for asked in (60, 0, 1):
        r = Raw(h, p)
        r.send(connect_packet(f"{t}-{asked}", keepalive=asked, flags=0x02 | 0x04 | 0x08,
                              will=(f"{t}/will/{asked}", "silent")))
        ack = r.recv()
        check(ack[0] == 2 and ack[2][1] == 0, f"CONNACK {ack}")
        # Server Keep Alive is property 0x13 (two bytes).
        check(b"\x13\x00\x02" in ack[2], f"no Server Keep Alive 2 in {ack[2]!r}")
        start = time.time()
        got = r.closed(timeout=8)
        took = time.time() - start
        check(2.9 <= took <= 5.5 and reason_of(got) == 0x8D, f"asked {asked}: closed after {took:.1f} s, {got}")
        check(w.message().payload == b"silent", "no will")
    c = Client(h, p, f"{t}-same")
    _, _, pr = c.connect(keepalive=2)
    check(not hasattr(pr, "ServerKeepAlive"), f"told {pr}")
    c.stop()
    r = connected_raw(h, p, f"{t}-v311", level=4, keepalive=60)
    time.sleep(3.5)
    r.send(packet(0xC0, b""))
    got = r.recv()
    check(got is not None and got[0] == 13, f"3.1.1 client with keep-alive 60 was closed: {got}")
    r.close()
    w.stop()


@case("5:MQTT-3.1.2-21", "5:MQTT-3.2.2-21", node="ska", clients="mosquitto")
def server_keep_alive_mosquitto_client(h, p, t):
    """mosquitto_sub asking keep-alive 60 of a broker with server_keep_alive 2 s follows the Server Keep
    Alive (pings every 2 s) and stays connected."""
    proc = mosquitto_sub(h, p, ["-V", "mqttv5", "-k", "60", "-t", f"{t}/x", "-q", "1"], timeout=8)
    time.sleep(4)  # more than 1.5 x 2 s: only its PINGREQs keep it
    mosquitto_pub(h, p, ["-V", "mqttv5", "-t", f"{t}/x", "-q", "1", "-m", "still here"])
    out, err = collect(proc)
    check(out.strip() == "still here", f"mosquitto_sub printed {out!r} {err!r}")


# ---------------------------------------------------------------------------
# PUBLISH


@case("3:MQTT-3.3.4-1", "5:MQTT-3.3.4-1", "3:MQTT-3.8.4-6", "5:MQTT-3.8.4-8", "3:MQTT-3.3.2-3",
      "5:MQTT-3.3.2-3", "3:MQTT-3.3.1-2", "5:MQTT-3.3.1-2")
def qos_flows_and_granted_qos(h, p, t):
    """Every QoS is acknowledged as its flow says; delivery is at min(published, granted)."""
    for v5 in (False, True):
        subs = {}
        for q in (0, 1, 2):
            s = Client(h, p, f"{t}-s{q}{int(v5)}", v5=v5)
            s.connect()
            s.subscribe(f"{t}{int(v5)}/+/q", q)
            subs[q] = s
        pub = Client(h, p, f"{t}-p{int(v5)}", v5=v5)
        pub.connect()
        for q in (0, 1, 2):
            pub.publish(f"{t}{int(v5)}/a/q", f"q{q}".encode(), q)
        for granted, s in subs.items():
            got = sorted((m.payload, m.qos, m.topic, m.dup) for m in s.take(3))
            want = sorted((f"q{q}".encode(), min(q, granted), f"{t}{int(v5)}/a/q", False) for q in (0, 1, 2))
            check(got == want, f"granted {granted}: {got}")
            s.stop()
        pub.stop()


@case("3:MQTT-3.3.1-4", "5:MQTT-3.3.1-4", clients="raw")
def publish_qos_3_closes(h, p, t):
    """A PUBLISH with both QoS bits set: closed (5: DISCONNECT 0x81)."""
    for level in (4, 5):
        r = connected_raw(h, p, f"{t}{level}", level=level)
        r.send(publish_packet("a/b", b"x", qos=1, v5=level == 5, first=0x36))
        got = r.closed()
        check(level == 4 and got == [] or level == 5 and reason_of(got) == 0x81, f"level {level}: {got}")


@case("3:MQTT-3.3.2-2", "5:MQTT-3.3.2-2", "5:MQTT-4.7.0-1", "3:MQTT-4.7.3-1", "5:MQTT-4.7.3-1", clients="raw")
def wildcard_or_empty_topic_name_closes(h, p, t):
    """A PUBLISH to `a/+`, `a/#` or `` (no alias): closed (5: DISCONNECT 0x90 / 0x82)."""
    for name in ("a/+", "a/#", ""):
        for level in (4, 5):
            r = connected_raw(h, p, f"{t}{level}", level=level)
            r.send(publish_packet(name, b"x", qos=1, v5=level == 5))
            got = r.closed()
            check(level == 4 and got == [] or level == 5 and reason_of(got) in (0x90, 0x82),
                  f"{name!r} level {level}: {got}")


@case("3:MQTT-3.3.1-5", "3:MQTT-3.3.1-6", "3:MQTT-3.3.1-7", "3:MQTT-3.3.1-8", "3:MQTT-3.3.1-9",
      "3:MQTT-3.3.1-10", "3:MQTT-3.3.1-11", "3:MQTT-3.3.1-12", "3:MQTT-3.1.2-7")
def retained_messages_v311(h, p, t):
    """3.1.1: retained set, replaced (QoS 0 too), cleared by an empty payload, untouched by retain 0;
    retain 1 only on what a new subscription gets, kept after the publisher's session ends."""
    pub = Client(h, p, f"{t}-p", v5=False)
    pub.connect(clean=False)
    pub.publish(f"{t}/r", b"first", 1, retain=True)
    pub.publish(f"{t}/r", b"second", 0, retain=True)
    pub.publish(f"{t}/r", b"not retained", 1, retain=False)
    pub.publish(f"{t}/gone", b"x", 1, retain=True)
    pub.publish(f"{t}/gone", b"", 1, retain=True)
    pub.stop()
    clean = Client(h, p, f"{t}-p", v5=False)
    clean.connect(clean=True)  # ends the publisher's session
    clean.stop()
    time.sleep(0.3)
    s = Client(h, p, f"{t}-s", v5=False)
    s.connect()
    s.subscribe(f"{t}/#", 1)
    m = s.message()
    check((m.topic, m.payload, m.retain) == (f"{t}/r", b"second", True), f"got {m.topic} {m.payload!r} {m.retain}")
    s.nothing()
    pub = Client(h, p, f"{t}-p2", v5=False)
    pub.connect()
    pub.publish(f"{t}/r", b"live", 1, retain=True)
    m = s.message()
    check(m.payload == b"live" and not m.retain, f"live delivery retain={m.retain}")
    pub.publish(f"{t}/r", b"", 1, retain=True)
    s.take(1)  # the empty publish itself is delivered normally
    s.stop()
    pub.stop()


@case("5:MQTT-3.3.1-5", "5:MQTT-3.3.1-6", "5:MQTT-3.3.1-7", "5:MQTT-3.3.1-8", "5:MQTT-3.3.1-9",
      "5:MQTT-3.3.1-10", "5:MQTT-3.3.1-11", "5:MQTT-3.3.1-12", "5:MQTT-3.3.1-13", "5:MQTT-3.8.4-3",
      "5:MQTT-3.8.4-4")
def retained_and_subscription_options_v5(h, p, t):
    """5: retained storage, Retain Handling 0/1/2 (also on re-subscribe) and Retain As Published."""
    pub = Client(h, p, f"{t}-p")
    pub.connect()
    for i, q in enumerate((0, 1, 2)):
        pub.publish(f"{t}/r/{i}", f"r{i}".encode(), q, retain=True)
    pub.publish(f"{t}/r/0", b"plain", 1, retain=False)  # leaves r0 retained
    pub.publish(f"{t}/gone", b"x", 1, retain=True)
    pub.publish(f"{t}/gone", b"", 1, retain=True)
    s = Client(h, p, f"{t}-s")
    s.connect()
    got = s.take(0)
    s.subscribe(f"{t}/r/+", 2, retainHandling=1)
    got = sorted((m.topic, m.payload, m.qos, m.retain) for m in s.take(3))
    check(got == [(f"{t}/r/{i}", f"r{i}".encode(), i, True) for i in range(3)], f"RH 1 new: {got}")
    s.subscribe(f"{t}/r/+", 2, retainHandling=1)
    s.nothing()
    s.subscribe(f"{t}/r/+", 2, retainHandling=0)
    check(len(s.take(3)) == 3, "RH 0 re-subscribe")
    s.subscribe(f"{t}/r/+", 2, retainHandling=0)
    check(len(s.take(3)) == 3, "RH 0 re-subscribe again")
    s.subscribe(f"{t}/gone", 1, retainHandling=0)
    s.nothing()
    s2 = Client(h, p, f"{t}-s2")
    s2.connect()
    s2.subscribe(f"{t}/r/+", 2, retainHandling=2)
    s2.nothing()
    # Retain As Published: 1 keeps the flag on live deliveries, 0 clears it.
    rap = Client(h, p, f"{t}-rap")
    rap.connect()
    rap.subscribe(f"{t}/live", 1, retainAsPublished=True)
    s2.subscribe(f"{t}/live", 1, retainAsPublished=False)
    pub.publish(f"{t}/live", b"a", 1, retain=True)
    pub.publish(f"{t}/live", b"b", 1, retain=False)
    got = [(m.payload, m.retain) for m in rap.take(2)]
    check(got == [(b"a", True), (b"b", False)], f"RAP 1: {got}")
    got = [(m.payload, m.retain) for m in s2.take(2)]
    check(got == [(b"a", False), (b"b", False)], f"RAP 0: {got}")
    pub.publish(f"{t}/live", b"", 1, retain=True)
    for c in (s, s2, rap, pub):
        c.stop()


@case("5:MQTT-3.8.3-3", "5:MQTT-3.3.2-15", "5:MQTT-3.3.2-16", "5:MQTT-3.3.2-17", "5:MQTT-3.3.2-18",
      "5:MQTT-3.3.2-20", "5:MQTT-3.3.2-4")
def request_response_no_local(h, p, t):
    """5: requester and responder both subscribed to one topic with No Local; Response Topic,
    Correlation Data, user properties (in order), content type and payload format arrive unchanged."""
    a = Client(h, p, f"{t}-a")
    b = Client(h, p, f"{t}-b")
    a.connect()
    b.connect()
    a.subscribe(f"{t}/rr", 2, noLocal=True)
    b.subscribe(f"{t}/rr", 2, noLocal=True)
    up = [("k", "2"), ("a", "1"), ("k", "1")]
    a.publish(f"{t}/rr", b"request", 1, props(PacketTypes.PUBLISH, ResponseTopic=f"{t}/rr",
                                              CorrelationData=b"\x00\xffcorr", UserProperty=up,
                                              ContentType="application/json", PayloadFormatIndicator=1))
    req = b.message()
    pr = req.properties
    check(pr.ResponseTopic == f"{t}/rr" and pr.CorrelationData == b"\x00\xffcorr", f"request {pr}")
    check(pr.UserProperty == up, f"user properties {pr.UserProperty}")
    check(pr.ContentType == "application/json" and pr.PayloadFormatIndicator == 1, f"{pr}")
    # Reply with what came (as paho's own interoperability test does).
    b.publish(pr.ResponseTopic, b"response", 1, props(PacketTypes.PUBLISH, CorrelationData=pr.CorrelationData))
    resp = a.message()
    check(resp.payload == b"response" and resp.properties.CorrelationData == b"\x00\xffcorr", "response")
    a.nothing()
    b.nothing()
    a.stop()
    b.stop()


@case("5:MQTT-3.3.2-15", "5:MQTT-3.3.2-16", "5:MQTT-3.3.2-17", clients="mosquitto")
def request_response_mosquitto(h, p, t):
    """5: mosquitto_pub's response topic, correlation data and user property reach mosquitto_sub (-F %j)."""
    proc = mosquitto_sub(h, p, ["-V", "mqttv5", "-t", f"{t}/req", "-F", "%j"])
    mosquitto_pub(h, p, ["-V", "mqttv5", "-t", f"{t}/req", "-q", "1", "-m", "ping",
                         "-D", "publish", "response-topic", f"{t}/reply",
                         "-D", "publish", "correlation-data", "c-42",
                         "-D", "publish", "user-property", "site", "berlin"])
    out, err = collect(proc)
    check(out.strip(), f"mosquitto_sub printed nothing: {err}")
    j = json.loads(out.strip().splitlines()[0])
    pr = j.get("properties", {})
    check(pr.get("response-topic") == f"{t}/reply", f"{j}")
    check(pr.get("correlation-data") == "c-42", f"{j}")
    check(pr.get("user-properties") == [{"site": "berlin"}] or pr.get("user-properties") == {"site": "berlin"},
          f"{j}")


@case("5:MQTT-3.3.2-5", "5:MQTT-3.3.2-6")
def message_expiry_queued_and_retained(h, p, t):
    """5: a queued message past its expiry is not delivered; a live one carries the remaining interval;
    an expired retained message is not sent to new subscribers."""
    cid = f"{t}-s"
    s = Client(h, p, cid)
    s.connect(props=props(PacketTypes.CONNECT, SessionExpiryInterval=60))
    s.subscribe(f"{t}/x", 2)
    s.stop()
    pub = Client(h, p, f"{t}-p")
    pub.connect()
    pub.publish(f"{t}/x", b"expires", 1, props(PacketTypes.PUBLISH, MessageExpiryInterval=1))
    pub.publish(f"{t}/x", b"stays", 2, props(PacketTypes.PUBLISH, MessageExpiryInterval=30))
    pub.publish(f"{t}/ret", b"old", 1, props(PacketTypes.PUBLISH, MessageExpiryInterval=1), retain=True)
    pub.publish(f"{t}/ret2", b"fresh", 1, props(PacketTypes.PUBLISH, MessageExpiryInterval=30), retain=True)
    time.sleep(2.2)
    s = Client(h, p, cid)
    _, present, _ = s.connect(clean=False, props=props(PacketTypes.CONNECT, SessionExpiryInterval=0))
    check(present, "session lost")
    m = s.message()
    check(m.payload == b"stays", f"got {m.payload!r}")
    check(0 < m.properties.MessageExpiryInterval <= 28, f"remaining {m.properties.MessageExpiryInterval}")
    s.nothing()
    s.subscribe(f"{t}/+", 1)
    m = s.message()
    check(m.payload == b"fresh" and 0 < m.properties.MessageExpiryInterval <= 28, f"retained {m.payload!r}")
    s.nothing()
    pub.publish(f"{t}/ret2", b"", 1, retain=True)
    s.stop()
    pub.stop()


@case("5:MQTT-3.3.4-2", "5:MQTT-3.3.4-3", "5:MQTT-3.3.4-4", "5:MQTT-3.8.4-5", "5:MQTT-3.8.4-6",
      "5:MQTT-3.9.3-1")
def overlapping_subscriptions_and_identifiers(h, p, t):
    """5: overlapping subscriptions give one copy at the highest QoS carrying every identifier;
    one SUBSCRIBE with several filters gets one SUBACK with a code per filter, in order."""
    s = Client(h, p, f"{t}-s")
    s.connect()
    s.c.subscribe([(f"{t}/a/#", SubscribeOptions(qos=1)), (f"{t}/+/b", SubscribeOptions(qos=2))])
    rcs = s.wait("suback")[2]
    check([r.value for r in rcs] == [1, 2], f"SUBACK {rcs}")
    s.subscribe(f"{t}/a/b", 0, props=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=7))
    s.subscribe(f"{t}/a/+", 1, props=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=300000))
    pub = Client(h, p, f"{t}-p")
    pub.connect()
    pub.publish(f"{t}/a/b", b"x", 2)
    m = s.message()
    check(m.qos == 2, f"qos {m.qos}")
    check(sorted(m.properties.SubscriptionIdentifier) == [7, 300000], f"ids {m.properties}")
    s.nothing()
    s.stop()
    pub.stop()


@case("3:MQTT-3.8.4-4", "3:MQTT-3.8.4-5", "3:MQTT-3.9.3-1", "3:MQTT-3.9.3-2", "3:MQTT-3.8.4-1",
      "3:MQTT-3.8.4-2", "5:MQTT-3.8.4-1", "5:MQTT-3.8.4-2", "5:MQTT-3.8.4-7", "5:MQTT-3.9.3-2",
      "3:MQTT-3.8.3-1", "5:MQTT-3.8.3-1", "3:MQTT-4.7.1-2", "5:MQTT-4.7.1-2", "3:MQTT-4.7.1-3",
      "5:MQTT-4.7.1-3", clients="raw")
def suback_codes_in_order(h, p, t):
    """One SUBSCRIBE with valid and invalid filters (`#` not last, `+` not a whole level; paho refuses to
    send those): one SUBACK, same packet id, a code per filter in order (3.1.1: 0x80; 5: 0x8F + reason)."""
    for level in (4, 5):
        r = connected_raw(h, p, f"{t}{level}", level=level)
        filters = [(f"{t}/a", 2), (f"{t}/#/x", 1), (f"{t}/+/c", 0), (f"{t}/d+", 1)]
        body = struct.pack(">H", 4242) + (b"\x00" if level == 5 else b"")
        for f, q in filters:
            body += s16(f) + bytes([q])
        r.send(packet(0x82, body))
        ack = r.recv()
        check(ack[0] == 9 and ack[2][:2] == struct.pack(">H", 4242), f"SUBACK {ack}")
        bad = 0x8F if level == 5 else 0x80
        codes = list(ack[2][-4:])
        check(codes == [2, bad, 0, bad], f"level {level}: codes {codes}")
        if level == 5:
            check(b"\x1f" in ack[2][2:-4], f"no reason string in {ack[2]!r}")
        r.close()


@case("3:MQTT-3.8.4-3", "5:MQTT-3.8.4-3")
def resubscribe_replaces(h, p, t):
    """Subscribing again to the same filter replaces the subscription (new QoS), no duplicate delivery."""
    for v5 in (False, True):
        s = Client(h, p, f"{t}-{int(v5)}", v5=v5)
        s.connect()
        s.subscribe(f"{t}/{int(v5)}", 0)
        s.subscribe(f"{t}/{int(v5)}", 2)
        pub = Client(h, p, f"{t}-p{int(v5)}", v5=v5)
        pub.connect()
        pub.publish(f"{t}/{int(v5)}", b"x", 2)
        m = s.message()
        check(m.qos == 2, f"qos {m.qos}")
        s.nothing()
        s.stop()
        pub.stop()


@case("3:MQTT-3.8.1-1", "5:MQTT-3.8.1-1", "3:MQTT-3.8.3-3", "5:MQTT-3.8.3-2", "3:MQTT-3.8.3-4",
      "5:MQTT-3.8.3-5", clients="raw")
def malformed_subscribe_closes(h, p, t):
    """SUBSCRIBE with wrong fixed-header flags, no filter, reserved option bits or QoS 3: closed."""
    for level in (4, 5):
        pr = b"\x00" if level == 5 else b""
        f = s16("a/b")
        for first, body in [
            (0x80, b"\x00\x01" + pr + f + b"\x01"),  # flags 0000
            (0x82, b"\x00\x01" + pr),  # no filter
            (0x82, b"\x00\x01" + pr + f + b"\xc1"),  # reserved bits
            (0x82, b"\x00\x01" + pr + f + b"\x03"),  # QoS 3
        ]:
            r = connected_raw(h, p, f"{t}{level}", level=level)
            r.send(packet(first, body))
            got = r.closed()
            check(all(x[0] == 14 and x[2][0] >= 0x80 for x in got), f"level {level} {first:#x} {body!r}: {got}")


@case("5:MQTT-3.8.3-4", clients="raw")
def no_local_on_shared_subscription_is_a_protocol_error(h, p, t):
    """5: No Local on a $share subscription: DISCONNECT 0x82."""
    r = connected_raw(h, p, t)
    r.send(packet(0x82, b"\x00\x01\x00" + s16(f"$share/g/{t}/x") + b"\x05"))
    got = r.closed()
    check(reason_of(got) == 0x82, f"got {got}")


@case("3:MQTT-3.3.1-1", "5:MQTT-3.3.1-1", "3:MQTT-3.3.1-3", "5:MQTT-3.3.1-3", clients="raw+paho")
def redelivery_sets_dup(h, p, t):
    """An unacknowledged QoS 1 delivery is sent again with DUP on reconnect (persistent session)."""
    for level in (4, 5):
        cid = f"{t}{level}"
        cp = bytes([0x11]) + struct.pack(">I", 60) if level == 5 else b""
        r = connected_raw(h, p, cid, level=level, flags=0x00, props=cp)
        r.send(packet(0x82, b"\x00\x01" + (b"\x00" if level == 5 else b"") + s16(f"{t}/{level}") + b"\x01"))
        check(r.recv()[0] == 9, "SUBACK")
        pub = Client(h, p, f"{cid}-p", v5=level == 5)
        pub.connect()
        pub.publish(f"{t}/{level}", b"x", 1)
        first = r.recv()
        check(first[0] == 3 and first[1] & 0x08 == 0, f"first delivery {first}")
        r.close()  # no PUBACK
        time.sleep(0.3)
        r = connected_raw(h, p, cid, level=level, flags=0x00, props=cp)
        again = r.recv()
        check(again[0] == 3 and again[1] & 0x08, f"redelivery without DUP: {again}")
        r.close()
        pub.stop()


# ---------------------------------------------------------------------------
# Flow control, sizes, aliases


@case("5:MQTT-3.3.4-9", "5:MQTT-3.3.4-10")
def receive_maximum_is_respected(h, p, t):
    """5: a client with Receive Maximum 3 that does not acknowledge has 3 QoS 1/2 deliveries in flight,
    no more; it still gets SUBACK and PINGRESP; acknowledging lets the rest through; it stays connected."""
    s = Client(h, p, f"{t}-s", manual_ack=True)
    s.connect(props=props(PacketTypes.CONNECT, ReceiveMaximum=3))
    s.subscribe(f"{t}/x", 2)
    pub = Client(h, p, f"{t}-p")
    pub.connect()
    for i in range(12):
        pub.publish(f"{t}/x", str(i).encode(), 1)
    held = s.take(3)
    s.nothing(1.0)
    s.subscribe(f"{t}/other", 1)  # answered although the window is full
    got = [m.payload for m in held]
    while len(got) < 12:
        for m in held:
            s.c.ack(m.mid, m.qos)
        held = s.take(min(3, 12 - len(got)))
        got += [m.payload for m in held]
    for m in held:
        s.c.ack(m.mid, m.qos)
    check(got == [str(i).encode() for i in range(12)], f"order {got}")
    check(s.disconnects.empty(), "disconnected")
    s.stop()
    pub.stop()


@case("5:MQTT-3.3.4-9", "5:MQTT-3.3.4-10", clients="raw+paho")
def receive_maximum_counts_qos2_until_pubcomp(h, p, t):
    """5: Receive Maximum 2, QoS 1 and 2 mixed: never more than 2 PUBLISHes unacknowledged (a QoS 2 one
    counts until PUBCOMP); PINGRESP comes while the window is full; all 10 arrive, in order."""
    cp = bytes([0x21]) + struct.pack(">H", 2)
    r = connected_raw(h, p, f"{t}-s", props=cp)
    r.send(packet(0x82, b"\x00\x01\x00" + s16(f"{t}/x") + b"\x02"))
    check(r.recv()[0] == 9, "SUBACK")
    pub = Client(h, p, f"{t}-p")
    pub.connect()
    for i in range(10):
        pub.publish(f"{t}/x", str(i).encode(), 1 + i % 2)
    got, open_ids, recd, pinged = [], {}, set(), False
    while len(got) < 10:
        pk = r.recv(timeout=5)
        check(pk is not None, "closed")
        kind, flags, body = pk
        if kind == 3:
            qos = (flags >> 1) & 3
            n = struct.unpack(">H", body[:2])[0]
            pid = struct.unpack(">H", body[2 + n:4 + n])[0]
            plen = body[4 + n]  # property length (< 128 here)
            got.append(body[5 + n + plen:])
            open_ids[pid] = qos
            check(len(open_ids) <= 2, f"{len(open_ids)} in flight: {open_ids}")
            if len(open_ids) == 2:
                if not pinged and not recd:
                    # Nothing else is due from the server now: the answer is PINGRESP.
                    r.send(packet(0xC0, b""))
                    pk = r.recv(timeout=5)
                    check(pk is not None and pk[0] == 13, f"no PINGRESP while the window is full: {pk}")
                    pinged = True
                for pid, q in sorted(open_ids.items()):
                    if q == 1:
                        r.send(packet(0x40, struct.pack(">H", pid)))
                        del open_ids[pid]
                    elif pid not in recd:
                        r.send(packet(0x50, struct.pack(">H", pid)))
                        recd.add(pid)
        elif kind == 6:  # PUBREL: complete
            pid = struct.unpack(">H", body[:2])[0]
            r.send(packet(0x70, struct.pack(">H", pid)))
            open_ids.pop(pid, None)
            recd.discard(pid)
        if len(got) == 10 and open_ids:
            for pid, q in list(open_ids.items()):
                r.send(packet(0x40 if q == 1 else 0x50, struct.pack(">H", pid)))
    check(got == [str(i).encode() for i in range(10)], f"got {got}")
    check(pinged, "the window was never full")
    r.close()
    pub.stop()


@case("5:MQTT-3.1.2-24", "5:MQTT-3.1.2-25")
def client_maximum_packet_size(h, p, t):
    """5: a message larger than the client's Maximum Packet Size is skipped (as if sent); the next one arrives."""
    s = Client(h, p, f"{t}-s")
    s.connect(props=props(PacketTypes.CONNECT, MaximumPacketSize=128))
    s.subscribe(f"{t}/x", 1)
    pub = Client(h, p, f"{t}-p")
    pub.connect()
    pub.publish(f"{t}/x", b"." * 200, 1)
    pub.publish(f"{t}/x", b"small", 1)
    m = s.message()
    check(m.payload == b"small", f"got {len(m.payload)} bytes")
    s.nothing()
    s.stop()
    pub.stop()


@case("5:MQTT-3.2.2-15", clients="raw")
def server_maximum_packet_size(h, p, t):
    """5: a packet over the Maximum Packet Size the server announced in CONNACK (which the client MUST NOT
    send): the server's side, DISCONNECT 0x95."""
    r = Raw(h, p)
    r.send(connect_packet(t))
    ack = r.recv()
    body = ack[2]
    i = body.find(b"\x27")
    check(i > 0, f"no Maximum Packet Size in CONNACK {body!r}")
    mps = struct.unpack(">I", body[i + 1:i + 5])[0]
    r.send(publish_packet(f"{t}/x", b"." * mps, qos=0))
    got = r.closed()
    check(reason_of(got) == 0x95, f"got {got}")


@case("5:MQTT-3.1.2-26", "5:MQTT-3.1.2-27", "5:MQTT-3.3.2-11")
def server_topic_aliases_within_client_maximum(h, p, t):
    """5: a client announcing Topic Alias Maximum 2 gets aliases 1..2 only; one announcing none gets none."""
    s = Client(h, p, f"{t}-s")
    s.connect(props=props(PacketTypes.CONNECT, TopicAliasMaximum=2))
    s.subscribe(f"{t}/#", 1)
    n = Client(h, p, f"{t}-n")
    n.connect()
    n.subscribe(f"{t}/#", 1)
    pub = Client(h, p, f"{t}-p")
    pub.connect()
    for r in range(2):
        for i in range(4):
            pub.publish(f"{t}/topic{i}", f"{r}{i}".encode(), 1)
    aliases = [getattr(m.properties, "TopicAlias", 0) for m in s.take(8)]
    check(all(0 <= a <= 2 for a in aliases) and any(aliases), f"aliases {aliases}")
    check(not any(hasattr(m.properties, "TopicAlias") for m in n.take(8)), "aliases to a client that allowed none")
    for c in (s, n, pub):
        c.stop()


@case("5:MQTT-3.3.2-7", "5:MQTT-3.3.2-8", "5:MQTT-3.3.2-12", clients="raw+paho")
def client_topic_aliases(h, p, t):
    """5: aliases up to the server's maximum are accepted; 0 or above it is DISCONNECT 0x94; aliases do
    not carry over to the next connection."""
    s = Client(h, p, f"{t}-s")
    s.connect()
    s.subscribe(f"{t}/#", 1)
    r = connected_raw(h, p, f"{t}-r")
    ta = lambda a: bytes([0x23]) + struct.pack(">H", a)
    r.send(publish_packet(f"{t}/long/name", b"one", qos=1, pkid=1, props=ta(1)))
    r.send(publish_packet("", b"two", qos=1, pkid=2, props=ta(1)))
    check(r.recv()[0] == 4 and r.recv()[0] == 4, "PUBACKs")
    check([(m.topic, m.payload) for m in s.take(2)] == [(f"{t}/long/name", b"one"), (f"{t}/long/name", b"two")],
          "aliased publish")
    r.close()
    r = connected_raw(h, p, f"{t}-r")
    r.send(publish_packet("", b"three", qos=1, pkid=3, props=ta(1)))
    got = r.closed()
    check(reason_of(got) in (0x94, 0x82), f"alias carried over: {got}")
    for bad in (0, 65535):
        r = connected_raw(h, p, f"{t}-r")
        r.send(publish_packet(f"{t}/x", b"bad", qos=1, pkid=4, props=ta(bad)))
        got = r.closed()
        check(reason_of(got) == 0x94, f"alias {bad}: {got}")
    s.nothing()
    s.stop()


@case("5:MQTT-3.3.2-17", "5:MQTT-3.14.2-1")
def user_properties_on_every_client_packet(h, p, t):
    """5: user properties on CONNECT, SUBSCRIBE, UNSUBSCRIBE, PUBLISH and DISCONNECT are taken (no
    error); the PUBLISH's reach the subscriber; a normal DISCONNECT with them publishes no will."""
    up = [("x", "1"), ("x", "2")]
    w = will_watch(h, p, t)
    c = Client(h, p, f"{t}-c")
    c.c.will_set(f"{t}/will/c", b"must not", qos=1)
    c.connect(props=props(PacketTypes.CONNECT, UserProperty=up))
    c.subscribe(f"{t}/x", 1, props=props(PacketTypes.SUBSCRIBE, UserProperty=up))
    c.subscribe(f"{t}/y", 1, props=props(PacketTypes.SUBSCRIBE, UserProperty=up))
    c.c.unsubscribe(f"{t}/y", properties=props(PacketTypes.UNSUBSCRIBE, UserProperty=up))
    c.wait("unsuback")
    c.publish(f"{t}/x", b"x", 1, props(PacketTypes.PUBLISH, UserProperty=up))
    m = c.message()
    check(m.properties.UserProperty == up, f"{m.properties}")
    check(c.disconnects.empty(), "disconnected")
    c.stop(props=props(PacketTypes.DISCONNECT, UserProperty=up))
    w.nothing(1.0)
    w.stop()


@case("5:MQTT-3.1.2-29")
def request_problem_information_zero(h, p, t):
    """5: Request Problem Information 0: a refused publish gets PUBACK 0x90 without a reason string."""
    pc = Client(h, p, f"{t}-p")
    pc.connect(props=props(PacketTypes.CONNECT, RequestProblemInformation=0))
    pc.c.publish("$SYS/x", b"x", qos=1)
    ev = pc.wait("puback")
    check(ev[2].value == 0x90, f"PUBACK {ev[2]}")
    check(ev[3] is None or not hasattr(ev[3], "ReasonString"), f"reason string sent: {ev[3]}")
    pc.stop()
    pc = Client(h, p, f"{t}-q")
    pc.connect()
    pc.c.publish("$SYS/x", b"x", qos=1)
    ev = pc.wait("puback")
    check(getattr(ev[3], "ReasonString", ""), "no reason string by default")
    pc.stop()


@case("5:MQTT-3.3.4-6", clients="raw")
def subscription_identifier_from_client_is_a_protocol_error(h, p, t):
    """5: a PUBLISH from a client carrying a Subscription Identifier: DISCONNECT 0x82."""
    r = connected_raw(h, p, t)
    r.send(publish_packet(f"{t}/x", b"x", qos=1, props=bytes([0x0B, 0x05])))
    got = r.closed()
    check(reason_of(got) == 0x82, f"got {got}")


# ---------------------------------------------------------------------------
# UNSUBSCRIBE, DISCONNECT, topics


@case("3:MQTT-3.10.4-1", "3:MQTT-3.10.4-2", "3:MQTT-3.10.4-4", "3:MQTT-3.10.4-5", "3:MQTT-3.10.4-6",
      "5:MQTT-3.10.4-1", "5:MQTT-3.10.4-2", "5:MQTT-3.10.4-4", "5:MQTT-3.10.4-5", "5:MQTT-3.10.4-6",
      "5:MQTT-3.11.3-1", "3:MQTT-3.10.3-1", "5:MQTT-3.10.3-1")
def unsubscribe(h, p, t):
    """UNSUBSCRIBE of several filters (one existing exactly, one not, one only matching): one UNSUBACK with the
    packet id (5: 0x00 / 0x11 per filter); delivery stops only for the exact filter."""
    for v5 in (False, True):
        s = Client(h, p, f"{t}-{int(v5)}", v5=v5)
        s.connect()
        base = f"{t}/{int(v5)}"
        s.subscribe(f"{base}/a", 1)
        s.subscribe(f"{base}/+", 1)
        rc, mid = s.c.unsubscribe([f"{base}/a", f"{base}/none", f"{base}/#"])
        ev = s.wait("unsuback")
        check(ev[1] == mid, f"UNSUBACK for {ev[1]}, UNSUBSCRIBE was {mid}")
        if v5:
            check([r.value for r in ev[2]] == [0x00, 0x11, 0x11], f"codes {ev[2]}")
        pub = Client(h, p, f"{t}-p{int(v5)}", v5=v5)
        pub.connect()
        pub.publish(f"{base}/a", b"via +", 1)
        m = s.message()
        check(m.payload == b"via +", "the + subscription stopped too")
        s.nothing()
        s.c.unsubscribe(f"{base}/+")
        s.wait("unsuback")
        pub.publish(f"{base}/a", b"none", 1)
        s.nothing()
        s.stop()
        pub.stop()


@case("3:MQTT-3.10.1-1", "5:MQTT-3.10.1-1", "3:MQTT-3.10.3-2", "5:MQTT-3.10.3-2", clients="raw")
def malformed_unsubscribe_closes(h, p, t):
    """UNSUBSCRIBE with wrong fixed-header flags or no filter: closed."""
    for level in (4, 5):
        pr = b"\x00" if level == 5 else b""
        for first, body in [(0xA0, b"\x00\x01" + pr + s16("a")), (0xA2, b"\x00\x01" + pr)]:
            r = connected_raw(h, p, f"{t}{level}", level=level)
            r.send(packet(first, body))
            got = r.closed()
            check(all(x[0] == 14 and x[2][0] >= 0x80 for x in got), f"level {level} {first:#x}: {got}")


@case("3:MQTT-3.14.1-1", "5:MQTT-3.14.1-1", "3:MQTT-3.6.1-1", "5:MQTT-3.6.1-1", clients="raw+paho")
def malformed_disconnect_and_pubrel_close(h, p, t):
    """DISCONNECT or PUBREL with wrong fixed-header flags: closed (and the will is published)."""
    for level in (4, 5):
        for first, body in [(0xE1, b""), (0x60, b"\x00\x01")]:
            w = will_watch(h, p, f"{t}{level}{first}", level == 5)
            r = connected_raw(h, p, f"{t}{level}", level=level, flags=0x02 | 0x04 | 0x08,
                              will=(f"{t}{level}{first}/will/d", "bad"))
            r.send(packet(first, body))
            got = r.closed()
            check(all(x[0] == 14 and x[2][0] >= 0x80 for x in got), f"level {level} {first:#x}: {got}")
            check(w.message().payload == b"bad", "no will after a malformed packet")
            w.stop()


@case("3:MQTT-4.7.2-1", "5:MQTT-4.7.2-1", "3:MQTT-4.7.3-4", "5:MQTT-4.7.3-4")
def dollar_topics_and_no_normalisation(h, p, t):
    """`#` and `+/…` do not match `$…` names; `$x/#` does; names are matched byte for byte."""
    s = Client(h, p, f"{t}-s")
    s.connect()
    s.subscribe("+/dollar", 1)
    d = Client(h, p, f"{t}-d")
    d.connect()
    d.subscribe(f"${t}/#", 1)
    u = Client(h, p, f"{t}-u")
    u.connect()
    u.subscribe(f"{t}/Caf\u00e9", 1)
    pub = Client(h, p, f"{t}-p")
    pub.connect()
    pub.publish(f"${t}/dollar", b"x", 1)
    pub.publish(f"{t}/Cafe\u0301", b"decomposed", 1)
    pub.publish(f"{t}/caf\u00e9", b"lower", 1)
    pub.publish(f"{t}/Caf\u00e9", b"exact", 1)
    check(d.message().topic == f"${t}/dollar", "$ filter")
    check(u.message().payload == b"exact", "normalised")
    u.nothing()
    s.nothing()
    for c in (s, d, u, pub):
        c.stop()


@case("3:MQTT-3.1.4-5", "5:MQTT-3.1.4-6", clients="raw+paho")
def nothing_processed_after_a_refused_connect(h, p, t):
    """A refused CONNECT followed in the same write by a retained PUBLISH: the publish is not processed."""
    r = Raw(h, p)
    r.send(connect_packet("", level=4, flags=0x00) + publish_packet(f"{t}/x", b"sneaked", qos=0, v5=False,
                                                                      first=0x31))
    r.closed()
    s = Client(h, p, f"{t}-s")
    s.connect()
    s.subscribe(f"{t}/#", 1)
    s.nothing()
    s.stop()


@case("3:MQTT-3.1.2-8", clients="mosquitto")
def will_seen_by_mosquitto_sub(h, p, t):
    """A 3.1.1 will on keep-alive expiry reaches mosquitto_sub."""
    proc = mosquitto_sub(h, p, ["-t", f"{t}/will", "-q", "1"])
    r = connected_raw(h, p, f"{t}-d", level=4, keepalive=1, flags=0x02 | 0x04 | 0x08, will=(f"{t}/will", "bye"))
    out, err = collect(proc)
    r.close()
    check(out.strip() == "bye", f"mosquitto_sub printed {out!r} {err!r}")


# ===========================================================================
# AUTH: enhanced authentication with SCRAM-SHA-256 (`--node auth`). The SCRAM
# client here is Python's own hashlib/hmac (RFC 5802 / 7677), independent of the
# broker's code.

SCRAM = "SCRAM-SHA-256"
SCRAM_USER, SCRAM_PASSWORD = "cf-scram", "cf-scram-pw"


class ScramClient:
    def __init__(self, user=SCRAM_USER, password=SCRAM_PASSWORD):
        self.password = password
        self.nonce = base64.b64encode(os.urandom(18)).decode()
        self.bare = f"n={user},r={self.nonce}"
        self.expect = None

    def first(self):
        return ("n,," + self.bare).encode()

    def final(self, server_first):
        sf = server_first.decode()
        attrs = dict(a.split("=", 1) for a in sf.split(","))
        check(attrs["r"].startswith(self.nonce) and len(attrs["r"]) > len(self.nonce),
              f"server nonce does not extend ours: {sf}")
        check(int(attrs["i"]) >= 4096, f"iteration count below RFC 7677's minimum: {sf}")
        salted = hashlib.pbkdf2_hmac("sha256", self.password.encode(), base64.b64decode(attrs["s"]),
                                     int(attrs["i"]))
        client_key = hmac.new(salted, b"Client Key", "sha256").digest()
        stored = hashlib.sha256(client_key).digest()
        without = f"c=biws,r={attrs['r']}"
        msg = f"{self.bare},{sf},{without}".encode()
        proof = bytes(a ^ b for a, b in zip(client_key, hmac.new(stored, msg, "sha256").digest()))
        server_key = hmac.new(salted, b"Server Key", "sha256").digest()
        self.expect = b"v=" + base64.b64encode(hmac.new(server_key, msg, "sha256").digest())
        return f"{without},p={base64.b64encode(proof).decode()}".encode()


def prop_str(pid, v):
    return bytes([pid]) + s16(v)


def auth_props(method=SCRAM, data=None):
    out = b"" if method is None else prop_str(0x15, method)
    if data is not None:
        out += prop_str(0x16, data)
    return out


def auth_packet(reason, method=SCRAM, data=None, flags=0):
    pr = auth_props(method, data)
    return packet(0xF0 | flags, bytes([reason]) + varint(len(pr)) + pr)


def read_varint(b, i):
    n, mult = 0, 1
    while True:
        n += (b[i] & 0x7F) * mult
        mult *= 128
        i += 1
        if not b[i - 1] & 0x80:
            return n, i


def parse_props(b):
    """MQTT 5 properties -> {id: [values]} (strings decoded, binary as bytes)."""
    out = {}
    i = 0
    while i < len(b):
        pid = b[i]
        i += 1
        if pid in (0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A):
            v, i = b[i], i + 1
        elif pid in (0x13, 0x21, 0x22, 0x23):
            v, i = struct.unpack(">H", b[i:i + 2])[0], i + 2
        elif pid in (0x02, 0x11, 0x18, 0x27):
            v, i = struct.unpack(">I", b[i:i + 4])[0], i + 4
        elif pid == 0x0B:
            v, i = read_varint(b, i)
        elif pid == 0x26:
            kl = struct.unpack(">H", b[i:i + 2])[0]
            k = b[i + 2:i + 2 + kl].decode()
            i += 2 + kl
            vl = struct.unpack(">H", b[i:i + 2])[0]
            v = (k, b[i + 2:i + 2 + vl].decode())
            i += 2 + vl
        else:
            n = struct.unpack(">H", b[i:i + 2])[0]
            v = b[i + 2:i + 2 + n]
            if pid != 0x16 and pid != 0x09:
                v = v.decode()
            i += 2 + n
        out.setdefault(pid, []).append(v)
    return out


def reason_and_props(kind, body):
    """(reason code, properties) of a CONNACK, AUTH or DISCONNECT body."""
    if kind == 2:
        rc, rest = body[1], body[2:]
    else:
        if not body:
            return 0, {}
        rc, rest = body[0], body[1:]
    if not rest:
        return rc, {}
    n, i = read_varint(rest, 0)
    return rc, parse_props(rest[i:i + n])


def scram_connect(h, p, cid, user=SCRAM_USER, password=SCRAM_PASSWORD, method=SCRAM, keepalive=30):
    """CONNECT with SCRAM-SHA-256 and the exchange up to CONNACK: (raw, CONNACK rc, its properties, client)."""
    sc = ScramClient(user, password)
    r = Raw(h, p)
    r.send(connect_packet(cid, keepalive=keepalive, props=auth_props(method, sc.first())))
    got = r.recv()
    check(got is not None, "closed instead of AUTH")
    if got[0] == 2:
        rc, pr = reason_and_props(2, got[2])
        return r, rc, pr, sc
    check(got[0] == 15 and got[1] == 0, f"AUTH expected, got {got}")
    rc, pr = reason_and_props(15, got[2])
    check(rc == 0x18, f"AUTH reason {rc:#x}, 0x18 expected")
    check(pr.get(0x15) == [method], f"AUTH without the CONNECT's method: {pr}")
    r.send(auth_packet(0x18, method, sc.final(pr[0x16][0])))
    got = r.recv()
    check(got is not None and got[0] == 2, f"CONNACK expected, got {got}")
    rc, pr = reason_and_props(2, got[2])
    return r, rc, pr, sc


@case("5:MQTT-4.12.0-2", "5:MQTT-4.12.0-3", "5:MQTT-4.12.0-5", "5:MQTT-3.15.2-1", "5:MQTT-3.1.4-2",
      node="auth", clients="raw")
def scram_sha_256_login(h, p, t):
    """SCRAM-SHA-256: CONNECT + client-first, AUTH 0x18 + server-first, AUTH 0x18 + client-final, CONNACK 0x00
    with the method and a server-final whose signature checks; the connection then works."""
    r, rc, pr, sc = scram_connect(h, p, t)
    check(rc == 0, f"CONNACK {rc:#x}: {pr}")
    check(pr.get(0x15) == [SCRAM], f"CONNACK without the method: {pr}")
    check(pr.get(0x16) == [sc.expect], f"server-final {pr.get(0x16)} is not {sc.expect}")
    r.send(packet(0x82, struct.pack(">H", 1) + varint(0) + s16(f"{t}/x") + bytes([1])))
    check(r.recv()[0] == 9, "SUBACK expected")
    r.send(publish_packet(f"{t}/x", b"after scram", qos=1))
    kinds = {r.recv()[0], r.recv()[0]}
    check(kinds == {3, 4}, f"PUBACK and the delivery expected, got {kinds}")
    r.close()


@case("5:MQTT-4.12.0-4", "5:MQTT-3.1.4-2", node="auth", clients="raw")
def scram_wrong_password_or_user(h, p, t):
    """A wrong password, an unknown user: the exchange runs alike and ends in CONNACK 0x86, then the close."""
    for user, pw in ((SCRAM_USER, "not-the-password"), ("cf-nobody", SCRAM_PASSWORD)):
        r, rc, pr, _ = scram_connect(h, p, f"{t}-{user}", user=user, password=pw)
        check(rc == 0x86, f"{user}: CONNACK {rc:#x}")
        check(0x1F in pr, f"{user}: no reason string: {pr}")
        check(0x16 not in pr, f"{user}: a server-final on a refusal: {pr}")
        check(r.closed() == [], f"{user}: not closed after the refusal")


@case("5:MQTT-4.12.0-1", node="auth", clients="raw+paho")
def unknown_authentication_method(h, p, t):
    """An Authentication Method the broker does not offer: CONNACK 0x8C, closed (raw and paho)."""
    r = Raw(h, p)
    r.send(connect_packet(t, props=auth_props("GS2-KRB5", b"x")))
    got = r.closed()
    check(len(got) == 1 and got[0][0] == 2 and got[0][2][1] == 0x8C, f"got {got}")
    c = Client(h, p, f"{t}-paho")
    rc, _, _ = c.connect(props=props(PacketTypes.CONNECT, AuthenticationMethod="DIGEST-MD5"))
    check(rc == 0x8C, f"paho: {rc}")
    c.c.loop_stop()


@case("5:MQTT-4.12.1-1", "5:MQTT-4.12.0-5", node="auth", clients="raw")
def reauthentication(h, p, t):
    """AUTH 0x19 on an established connection: AUTH 0x18, then AUTH 0x00 with a checked server-final; the
    connection goes on. A re-authentication with another method: DISCONNECT 0x82."""
    r, rc, _, _ = scram_connect(h, p, t)
    check(rc == 0, f"CONNACK {rc:#x}")
    for _ in range(2):
        sc = ScramClient()
        r.send(auth_packet(0x19, SCRAM, sc.first()))
        got = r.recv()
        rc, pr = reason_and_props(15, got[2])
        check(got[0] == 15 and rc == 0x18 and pr.get(0x15) == [SCRAM], f"got {got}")
        r.send(auth_packet(0x18, SCRAM, sc.final(pr[0x16][0])))
        got = r.recv()
        rc, pr = reason_and_props(15, got[2])
        check(got[0] == 15 and rc == 0x00, f"AUTH 0x00 expected, got {got}")
        check(pr.get(0x16) == [sc.expect] and pr.get(0x15) == [SCRAM], f"server-final: {pr}")
    r.send(packet(0xC0, b""))
    check(r.recv()[0] == 13, "PINGRESP after re-authentication")
    r.send(auth_packet(0x19, "SCRAM-SHA-1", ScramClient().first()))
    got = r.closed()
    check(reason_of(got) == 0x82, f"another method: {got}")


@case("5:MQTT-4.12.1-2", node="auth", clients="raw")
def failed_reauthentication_disconnects(h, p, t):
    """A re-authentication with a wrong password: DISCONNECT 0x87 with a reason string, then the close."""
    r, rc, _, _ = scram_connect(h, p, t)
    check(rc == 0, f"CONNACK {rc:#x}")
    sc = ScramClient(password="wrong")
    r.send(auth_packet(0x19, SCRAM, sc.first()))
    got = r.recv()
    check(got[0] == 15, f"AUTH expected, got {got}")
    r.send(auth_packet(0x18, SCRAM, sc.final(reason_and_props(15, got[2])[1][0x16][0])))
    got = r.closed()
    rc, pr = reason_and_props(14, got[0][2]) if got else (None, {})
    check(rc == 0x87 and 0x1F in pr, f"got {got}")


@case("5:MQTT-4.12.0-6", "5:MQTT-4.12.0-7", node="auth", clients="raw")
def auth_without_an_authentication_method(h, p, t):
    """Connected with user name and password (no method): CONNACK has no method; an AUTH from the client is
    a protocol error (DISCONNECT 0x82)."""
    r = Raw(h, p)
    r.send(connect_packet(t, flags=0x02 | 0x80 | 0x40, tail=s16(SCRAM_USER) + s16(SCRAM_PASSWORD)))
    got = r.recv()
    rc, pr = reason_and_props(2, got[2])
    check(got[0] == 2 and rc == 0 and 0x15 not in pr and 0x16 not in pr, f"got {got}")
    r.send(auth_packet(0x19, SCRAM, ScramClient().first()))
    got = r.closed()
    check(reason_of(got) == 0x82, f"got {got}")


@case("5:MQTT-3.15.1-1", "5:MQTT-3.1.0-1", "5:MQTT-3.1.2-30", node="auth", clients="raw")
def malformed_or_misplaced_auth(h, p, t):
    """AUTH with fixed-header flags set: DISCONNECT 0x81. AUTH as the first packet: closed with nothing sent.
    A PUBLISH where the client-final is due: CONNACK 0x82. AUTH on a 3.1.1 connection: closed."""
    r, rc, _, _ = scram_connect(h, p, t)
    check(rc == 0, f"CONNACK {rc:#x}")
    r.send(auth_packet(0x19, SCRAM, ScramClient().first(), flags=0x01))
    got = r.closed()
    check(reason_of(got) == 0x81, f"flags: {got}")
    r = Raw(h, p)
    r.send(auth_packet(0x19, SCRAM, ScramClient().first()))
    check(r.closed() == [], "AUTH before CONNECT was answered")
    sc = ScramClient()
    r = Raw(h, p)
    r.send(connect_packet(f"{t}-early", props=auth_props(SCRAM, sc.first())))
    check(r.recv()[0] == 15, "AUTH expected")
    r.send(publish_packet(f"{t}/x", b"too early"))
    got = r.closed()
    check(len(got) == 1 and got[0][0] == 2 and got[0][2][1] == 0x82, f"publish before CONNACK: {got}")
    r = connected_raw(h, p, f"{t}-4", level=4, flags=0x02 | 0x80 | 0x40,
                      tail=s16(SCRAM_USER) + s16(SCRAM_PASSWORD))
    r.send(packet(0xF0, b"\x00"))
    check(r.closed() == [], "3.1.1 AUTH was answered")


# ===========================================================================


def run(h, p, node, only):
    cases = [c for c in CASES if c["node"] == node and (not only or c["name"] in only)]
    results = {}
    lock = threading.Lock()
    # Client ids and topics of this run: a broker run against before keeps
    # sessions and retained messages of the last run.
    run_id = f"{random.getrandbits(16):04x}"

    def one(c):
        start = time.time()
        try:
            c["fn"](h, p, f"cf{run_id}-" + c["name"].replace("_", "-")[:40])
            res = ("pass", "")
        except Failed as e:
            res = ("FAIL", str(e))
        except Exception:
            res = ("FAIL", traceback.format_exc())
        with lock:
            results[c["name"]] = res
            print(f"{res[0]:4} {c['name']} ({time.time() - start:.1f} s) {res[1]}", flush=True)

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(one, cases))
    failed = [n for n, r in results.items() if r[0] != "pass"]
    print(f"{len(cases) - len(failed)}/{len(cases)} cases passed", flush=True)
    return not failed


# Statements of the covered sections the suite does not claim yet, printed in the table.
PENDING = []


def table():
    """The statement table of docs/mqtt.md: one row per statement, the cases that check it."""
    rows = {}
    for c in CASES:
        for st in c["statements"]:
            v, sid = st.split(":")
            r = rows.setdefault((v, sid), ([], set()))
            r[0].append(c["name"])
            r[1].update(c["clients"].split("+"))

    def key(k):
        parts = k[1].replace("MQTT-", "").replace("-", ".").split(".")
        return (k[0],) + tuple(int(x) for x in parts)

    print("| version | statement | tests (`conformance.py`) | clients | result |")
    print("| --- | --- | --- | --- | --- |")
    for k in sorted(rows, key=key):
        names, clients = rows[k]
        tests = ", ".join(f"`{n}`" for n in names)
        print(f"| {'3.1.1' if k[0] == '3' else '5.0'} | {k[1]} | {tests} | {', '.join(sorted(clients))} | pass |")
    for v, sid, why in PENDING:
        print(f"| {'3.1.1' if v == '3' else '5.0'} | {sid} | — | — | pending: {why} |")


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--table" in args:
        table()
        sys.exit(0)
    host, port = args[0], int(args[1])
    node = args[args.index("--node") + 1] if "--node" in args else "default"
    only = set(args[args.index("--only") + 1].split(",")) if "--only" in args else set()
    sys.exit(0 if run(host, port, node, only) else 1)
