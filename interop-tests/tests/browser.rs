//! The full node in headless Chromium, with real external publishers:
//!
//! - a page on `ws://…/v1/ws` subscribes, receives what `curl` (HTTP door) and
//!   `mosquitto_pub` (MQTT door) publish, acks each message, then publishes one that
//!   `mosquitto_sub` receives;
//! - MQTT.js's browser bundle (served from `interop-tests/js/node_modules`) runs the
//!   snippet of docs/websocket.md exactly as documented over `ws://…/mqtt`: it
//!   subscribes, receives its own message and what the documented `curl` and
//!   `mosquitto_pub` commands publish, and `mosquitto_sub` gets the page's publish.
//!
//! Chromium is driven over the DevTools protocol by `rocketgate_testkit::browser`;
//! the test reads the page's state with `Runtime.evaluate`. Chromium,
//! curl, the mosquitto clients and MQTT.js are installed by
//! `scripts/install-test-deps`; a missing one fails the test with that hint.

use std::process::Command;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use interop_tests::Node;
use interop_tests::doors::{self, Door, MqttSub, Outgoing};
use rocketgate_testkit::browser::{Browser, PAGE_WAIT, serve};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

/// A `/v1/ws` page: subscribes to `browser` (credit 1), acks each message and gives
/// the credit back, and after three messages publishes one of its own.
const V1_PAGE: &str = r#"<!doctype html>
<html><body><script>
const state = { phase: "connecting", received: [], errors: [] };
window.rg = state;
const ws = new WebSocket("ws://__ADDR__/v1/ws");
const send = (frame) => ws.send(JSON.stringify(frame));
ws.onopen = () => send({ op: "subscribe", req: "sub", id: "page", topic: "browser",
  group: "chromium", mode: "broadcasting", start: "latest", credit: 1 });
ws.onmessage = (event) => {
  const f = JSON.parse(event.data);
  if (f.type === "subscribed") state.phase = "subscribed";
  else if (f.type === "message") {
    state.received.push({ body: f.body, tag: f.tag, keys: f.keys, props: f.properties, attempt: f.attempt });
    send({ op: "ack", receipt: f.receipt });
    send({ op: "credit", id: f.subscription, n: 1 });
    if (state.received.length === 3)
      send({ op: "publish", req: "pub", topic: "browser-out", tag: "page", body: "hello from chromium" });
  } else if (f.type === "send_result") { state.published = f; state.phase = "done"; }
  else if (f.type === "error") state.errors.push(f);
};
ws.onerror = () => state.errors.push("websocket error");
ws.onclose = (e) => { state.closed = e.code; };
</script></body></html>"#;

/// The test pages are served from `http://127.0.0.1:<port>`: their origin may connect.
const PAGES: &[(&str, &str)] = &[(
    "ROCKETGATE_WS__ALLOWED_ORIGINS",
    r#"["http://127.0.0.1:*"]"#,
)];

fn outgoing(tag: &str, keys: &[&str], source: &str, body: &str) -> Outgoing {
    Outgoing {
        topic: "browser".into(),
        tag: tag.into(),
        keys: keys.iter().map(|k| k.to_string()).collect(),
        properties: [("source".to_string(), source.to_string())].into(),
        body: body.as_bytes().to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_ws_page_gets_curl_and_mosquitto_pub_messages_acks_and_publishes() {
    let node = Node::start_with_env(PAGES).expect("start");
    doors::create_topic(&node, "browser", 1).await.unwrap();
    let mut out = MqttSub::start_filter(&node, "browser-out", "browser-out/#").unwrap();
    let page = serve(vec![(
        "/",
        "text/html",
        V1_PAGE
            .replace("__ADDR__", &node.addr("ws").to_string())
            .into_bytes(),
    )])
    .await;
    let mut browser = Browser::open(&format!("http://{page}/")).await;
    browser.wait_until("rg.phase === 'subscribed'", "rg").await;

    // Real external publishers, one after the other (one queue: delivered in order).
    let curl1 = outgoing("a", &["k1"], "curl", "from curl");
    Door::Http.publish(&node, &curl1).await.unwrap();
    let mosq = outgoing("b/c", &[], "mosquitto", "from mosquitto_pub");
    Door::Mqtt.publish(&node, &mosq).await.unwrap();
    let curl2 = outgoing("d", &["k2", "k3"], "curl", "from curl again");
    Door::Http.publish(&node, &curl2).await.unwrap();

    let state = browser.wait_until("rg.phase === 'done'", "rg").await;
    assert_eq!(state["errors"], json!([]), "{state}");
    let received: Vec<Value> = state["received"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            json!([
                m["body"],
                m["tag"],
                m["keys"],
                m["props"]["source"],
                m["attempt"]
            ])
        })
        .collect();
    assert_eq!(
        received,
        [
            json!(["from curl", "a", ["k1"], "curl", 1]),
            json!(["from mosquitto_pub", "b/c", [], "mosquitto", 1]),
            json!(["from curl again", "d", ["k2", "k3"], "curl", 1]),
        ],
        "{state}"
    );
    assert_eq!(state["published"]["topic"], "browser-out", "{state}");

    // What the page published reaches an MQTT subscriber.
    let got = out.next(Duration::from_secs(30)).unwrap();
    assert_eq!(got.tag.as_deref(), Some("page"));
    assert_eq!(got.body, b"hello from chromium");

    // The page's acks reached the broker (frames are handled in order, so they were
    // processed before its publish was answered): with the browser gone, the same
    // durable subscriber resumes after the three, and the next message is the first
    // it gets.
    drop(browser);
    let url = format!("ws://{}/v1/ws", node.addr("ws"));
    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap();
    let subscribe = json!({"op": "subscribe", "id": "page", "topic": "browser",
        "group": "chromium", "mode": "broadcasting", "start": "earliest", "credit": 10});
    ws.send(Message::text(subscribe.to_string())).await.unwrap();
    let mut next_frame = async || loop {
        let frame = tokio::time::timeout(PAGE_WAIT, ws.next())
            .await
            .expect("a frame in time")
            .expect("the socket open")
            .unwrap();
        if let Message::Text(t) = frame {
            return serde_json::from_str::<Value>(&t).unwrap();
        }
    };
    let subscribed = next_frame().await;
    assert_eq!(subscribed["type"], "subscribed", "{subscribed}");
    assert_eq!(subscribed["resumed"], true, "{subscribed}");
    let fourth = outgoing("e", &[], "curl", "after the page left");
    Door::Http.publish(&node, &fourth).await.unwrap();
    let first = next_frame().await;
    assert_eq!(first["type"], "message", "{first}");
    assert_eq!(
        first["body"], "after the page left",
        "acked messages came again: {first}"
    );
    assert_eq!(first["queue_offset"], 3, "{first}");
}

/// The ```html block under "### MQTT.js in a browser" in docs/websocket.md, and the
/// ```sh block after it.
fn documented_mqttjs() -> (String, String) {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/websocket.md"))
        .unwrap();
    let section = &doc[doc
        .find("### MQTT.js in a browser")
        .expect("an MQTT.js section in docs/websocket.md")..];
    let block = |lang: &str| {
        let fence = format!("```{lang}\n");
        let start = section.find(&fence).expect("a fenced block") + fence.len();
        section[start..start + section[start..].find("```").unwrap()].to_owned()
    };
    (block("html"), block("sh"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqttjs_in_chromium_runs_the_documented_snippet_over_mqtt_path() {
    let (snippet, commands) = documented_mqttjs();
    let bundle = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("js/node_modules/mqtt/dist/mqtt.min.js");
    let bundle = std::fs::read(&bundle).unwrap_or_else(|e| {
        panic!(
            "{} ({e}): run scripts/install-test-deps (npm ci in interop-tests/js)",
            bundle.display()
        )
    });
    let node = Node::start_with_env(PAGES).expect("start");
    let (http, mqtt, ws) = (node.addr("http"), node.addr("mqtt"), node.addr("ws"));

    // The snippet as documented; only the bundle's URL and the address change.
    const CDN: &str = "https://unpkg.com/mqtt@5/dist/mqtt.min.js";
    assert!(snippet.contains(CDN) && snippet.contains("ws://127.0.0.1:8083/mqtt"));
    let html = format!(
        "<!doctype html><html><body><script>\nwindow.logged = [];\n\
         console.log = (...a) => window.logged.push(a);\n\
         console.warn = (...a) => window.logged.push(['WARN', ...a]);\n</script>\n{}\n</body></html>",
        snippet
            .replace(CDN, "/mqtt.min.js")
            .replace("127.0.0.1:8083", &ws.to_string())
    );
    let page = serve(vec![
        ("/", "text/html", html.into_bytes()),
        ("/mqtt.min.js", "text/javascript", bundle),
    ])
    .await;

    // The documented `mosquitto_sub -t 'sensors/browser/#'`, ready before the page runs.
    let mut sub = MqttSub::start_filter(&node, "sensors", "sensors/browser/#").unwrap();
    let mut browser = Browser::open(&format!("http://{page}/")).await;
    let logged = browser
        .wait_until("window.logged.length >= 1", "window.logged")
        .await;
    assert_eq!(
        logged,
        json!([["sensors/browser/hello", "hi from the browser", {}]]),
        "the page receives its own publish"
    );
    let got = sub.next(Duration::from_secs(30)).unwrap();
    assert_eq!(got.tag.as_deref(), Some("browser/hello"));
    assert_eq!(got.body, b"hi from the browser");

    // The documented curl and mosquitto_pub commands, on this node's ports.
    let commands = commands.replace("\\\n", " ");
    let publishers: Vec<&str> = commands
        .lines()
        .filter(|l| l.starts_with("curl") || l.starts_with("mosquitto_pub"))
        .collect();
    assert_eq!(publishers.len(), 2, "{commands}");
    for line in publishers {
        let line = line
            .replace("http://127.0.0.1:8080", &format!("http://{http}"))
            .replace("-h 127.0.0.1", &format!("-h 127.0.0.1 -p {}", mqtt.port()));
        // curl exits 0 on an HTTP error unless told otherwise.
        let line = if line.starts_with("curl") {
            format!("{line} -sS --fail-with-body")
        } else {
            line
        };
        let out = tokio::task::block_in_place(|| Command::new("sh").args(["-c", &line]).output())
            .expect("sh");
        assert!(
            out.status.success(),
            "`{line}` failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let logged = browser
        .wait_until("window.logged.length >= 3", "window.logged")
        .await;
    let mut rest: Vec<Value> = logged.as_array().unwrap()[1..].to_vec();
    // Two publishers, two queues of `sensors`: the order between them is not fixed.
    rest.sort_by_key(|v| v[0].as_str().unwrap_or_default().to_owned());
    assert_eq!(
        rest,
        [
            json!(["sensors/room1/temp", "21.5", {"unit": "C"}]),
            json!(["sensors/room2/temp", "19.0", {}]),
        ],
        "{logged}"
    );
}
