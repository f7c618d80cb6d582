"""An MQTT 5 persistent session for the story (interop-tests/src/story.rs), on Eclipse Paho.

Usage: story_mqtt.py HOST PORT CLIENT_ID FILTER COUNT

Connects with clean start off and a one-hour session expiry, subscribes FILTER at QoS 1
unless the session was still there (prints READY once it is subscribed), then for every message prints
`MSG <topic> <payload>` and only then PUBACKs it (manual acks): whatever is acked was
printed first. With COUNT < 0 it only makes sure the session exists and is subscribed,
prints and acks nothing, and disconnects. With COUNT > 0 it acks exactly COUNT messages, leaves any later ones
un-acked (they stay in the session) and disconnects cleanly; with COUNT = 0 it runs
until its stdin is closed, then disconnects the same way. It prints BYE at the end.
"""

import sys
import threading

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

HOST, PORT, CLIENT_ID, FILTER, COUNT = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])

done = threading.Event()
acked = 0
stopping = False
lock = threading.Lock()


def watch_stdin():
    """Closing our stdin asks us to stop: nothing more is printed or acked."""
    global stopping
    sys.stdin.read()
    with lock:
        stopping = True
    done.set()


def on_connect(c, userdata, flags, rc, props):
    if rc.is_failure:
        print(f"CONNACK {rc}", flush=True)
        done.set()
        return
    if flags.session_present:
        print("READY", flush=True)  # the session still holds the subscription
        if COUNT < 0:
            done.set()
    else:
        c.subscribe(FILTER, qos=1)


synced = threading.Event()
SYNC_FILTER = "story-sync/none"


def on_subscribe(c, userdata, mid, rcs, props):
    if done.is_set():
        synced.set()
    else:
        print("READY", flush=True)
        if COUNT < 0:
            done.set()


def on_message(c, userdata, msg):
    global acked
    with lock:
        if stopping or COUNT < 0 or (COUNT and acked >= COUNT):
            return  # left un-acked: the session redelivers it
        print(f"MSG {msg.topic} {msg.payload.decode('utf-8', 'replace')}", flush=True)
        c.ack(msg.mid, msg.qos)
        acked += 1
        if COUNT and acked >= COUNT:
            done.set()


c = mqtt.Client(
    mqtt.CallbackAPIVersion.VERSION2, client_id=CLIENT_ID, protocol=mqtt.MQTTv5, manual_ack=True
)
c.on_connect = on_connect
c.on_subscribe = on_subscribe
c.on_message = on_message
gone = threading.Event()
c.on_disconnect = lambda c, u, flags, rc, props: gone.set()
props = Properties(PacketTypes.CONNECT)
props.SessionExpiryInterval = 3600
c.connect(HOST, PORT, keepalive=30, clean_start=False, properties=props)
c.loop_start()
threading.Thread(target=watch_stdin, daemon=True).start()
done.wait()
# The server answers packets in order: once this SUBACK is back, it has processed
# every PUBACK sent before.
c.subscribe(SYNC_FILTER, qos=0)
if not synced.wait(20):
    print("no SUBACK for the sync subscription", flush=True)
c.unsubscribe(SYNC_FILTER)
c.disconnect()
# loop_stop right after disconnect() may end the network loop before the queued
# packets are written: wait until the DISCONNECT went out.
gone.wait(20)
c.loop_stop()
print("BYE", flush=True)
