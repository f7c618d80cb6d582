"""Paho (paho-mqtt 2.x) against a broker with authentication on: good, bad and
missing credentials on MQTT 3.1.1 and 5. Exits non-zero on the first surprise.

usage: paho_auth.py HOST PORT USER PASSWORD
"""
import sys
import threading

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

host, port, user, password = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]


def connect(protocol, username, pw):
    """The CONNACK's reason code (as an int) for these credentials."""
    done = threading.Event()
    got = {}
    c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=protocol)
    if username is not None:
        c.username_pw_set(username, pw)

    def on_connect(client, userdata, flags, reason_code, properties):
        got["rc"] = reason_code.value if hasattr(reason_code, "value") else int(reason_code)
        done.set()

    c.on_connect = on_connect
    c.connect(host, port, keepalive=30)
    c.loop_start()
    if not done.wait(20):
        raise SystemExit("no CONNACK")
    c.loop_stop()
    c.disconnect()
    return got["rc"]


# paho 2 reports a 3.1.1 CONNACK's return code as the MQTT 5 reason code it
# stands for: 4 (bad user name or password) as 0x86, 5 (not authorized) as 0x87.
checks = [
    # (protocol, user, password, expected reason code)
    (mqtt.MQTTv311, user, password, 0),
    (mqtt.MQTTv311, user, password + "x", 0x86),
    (mqtt.MQTTv311, None, None, 0x87),
    (mqtt.MQTTv5, user, password, 0),
    (mqtt.MQTTv5, user, password + "x", 0x86),
    (mqtt.MQTTv5, None, None, 0x87),
]
for protocol, u, p, want in checks:
    rc = connect(protocol, u, p)
    if rc != want:
        raise SystemExit(f"protocol {protocol} user {u!r}: CONNACK {rc:#x}, expected {want:#x}")
    print(f"protocol {protocol} user {u!r}: CONNACK {rc:#x} as expected")
