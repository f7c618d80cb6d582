"""MQTT 5 server redirection on a read-only slave, with paho-mqtt 2.x (issue #27
item 6, docs/mqtt.md "Server redirection"): a v5 publisher on the slave's door is
told DISCONNECT 0x9C (Use another server) with a Server Reference; it follows the
reference and its publish is acknowledged there; a persistent session asked of the
slave gets CONNACK 0x9C with the reference. Prints "ok <reference>"; exits non-zero
on the first surprise.

usage: mqtt_redirect.py SLAVE_HOST SLAVE_PORT TOPIC
"""
import queue
import sys

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

host, port, topic = sys.argv[1], int(sys.argv[2]), sys.argv[3]
WAIT = 20


def fail(why):
    print(f"FAIL {why}", flush=True)
    sys.exit(1)


def client(cid):
    events = queue.Queue()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv5,
                    reconnect_on_failure=False)
    c.on_connect = lambda c, u, f, rc, p: events.put(("connack", rc.value, p))
    c.on_publish = lambda c, u, mid, rc, p: events.put(("puback", rc.value, p))
    c.on_disconnect = lambda c, u, f, rc, p: events.put(("disconnect", rc.value, p))
    return c, events


def wait(events, kind):
    while True:
        try:
            ev = events.get(timeout=WAIT)
        except queue.Empty:
            fail(f"no {kind} in time")
        if ev[0] == kind:
            return ev


# A v5 publisher on the slave: DISCONNECT 0x9C with the Server Reference.
c, ev = client("redirect-pub")
c.connect(host, port, keepalive=30, clean_start=True)
c.loop_start()
_, rc, _ = wait(ev, "connack")
if rc != 0:
    fail(f"CONNACK {rc} on the slave (clean start)")
c.publish(topic, b"to the slave", qos=1)
_, rc, props = wait(ev, "disconnect")
c.loop_stop()
reference = getattr(props, "ServerReference", None) if props is not None else None
if rc != 0x9C or not reference:
    fail(f"DISCONNECT {rc:#x} with reference {reference!r}")

# Follow the reference: the master acknowledges the same publish.
first = reference.split()[0]
mhost, mport = first.rsplit(":", 1)
c, ev = client("redirect-pub")
c.connect(mhost, int(mport), keepalive=30, clean_start=True)
c.loop_start()
_, rc, _ = wait(ev, "connack")
if rc != 0:
    fail(f"CONNACK {rc} on the referenced server")
c.publish(topic, b"to the master", qos=1)
_, rc, _ = wait(ev, "puback")
if rc != 0:
    fail(f"PUBACK {rc} on the referenced server")
c.disconnect()
c.loop_stop()

# A persistent session asked of the slave: CONNACK 0x9C with the reference.
c, ev = client("redirect-persistent")
p = Properties(PacketTypes.CONNECT)
p.SessionExpiryInterval = 3600
c.connect(host, port, keepalive=30, clean_start=False, properties=p)
c.loop_start()
_, rc, props = wait(ev, "connack")
c.loop_stop()
got = getattr(props, "ServerReference", None) if props is not None else None
if rc != 0x9C or got != reference:
    fail(f"persistent CONNACK {rc:#x} with reference {got!r}")
print(f"ok {reference}", flush=True)
