//! End to end in headless Chromium: a page served by the test opens
//! `ws://127.0.0.1:PORT/v1/ws`, subscribes, receives what the test publishes
//! through the core, acks each message (and gives credit back one at a time),
//! then publishes a message of its own. The test drives Chromium through the
//! DevTools protocol (`rocketgate_testkit::browser`) and reads the page's state.
//!
//! Chromium is required: without it this test fails (it is installed by
//! `scripts/install-test-deps`). The same page against the whole node, fed by
//! `curl` and `mosquitto_pub`, and MQTT.js over `/mqtt`, are in
//! `interop-tests/tests/browser.rs`.

mod support;

use std::time::Duration;

use rocketgate_core::broker::filter::Filter;
use rocketgate_core::broker::{MessagingApi, PullRequest, QueueChoice};
use rocketgate_core::store::Message as CoreMessage;
use rocketgate_testkit::browser::{Browser, serve_page};
use serde_json::{Value, json};
use support::{Env, WAIT};

const PAGE: &str = r#"<!doctype html>
<html><body><pre id="log"></pre><script>
const state = { phase: "connecting", received: [], errors: [], waiters: [] };
window.rg = state;
function reach(phase) { state.phase = phase; state.waiters.filter(w => w.phase === phase).forEach(w => w.resolve()); }
window.rgWait = (phase) => new Promise(resolve => {
  if (state.phase === phase) resolve(); else state.waiters.push({ phase, resolve });
});
const ws = new WebSocket("ws://__ADDR__/v1/ws");
const send = (frame) => ws.send(JSON.stringify(frame));
ws.onopen = () => send({ op: "subscribe", req: "sub", id: "page", topic: "browser",
  group: "chromium", mode: "broadcasting", start: "latest", credit: 1 });
ws.onmessage = (event) => {
  const f = JSON.parse(event.data);
  if (f.type === "subscribed") reach("subscribed");
  else if (f.type === "message") {
    state.received.push({ body: f.body, tag: f.tag, keys: f.keys, props: f.properties, attempt: f.attempt });
    send({ op: "ack", receipt: f.receipt });
    send({ op: "credit", id: f.subscription, n: 1 });
    if (state.received.length === 3)
      send({ op: "publish", req: "pub", topic: "browser-out", tag: "page", body: "hello from chromium" });
  } else if (f.type === "send_result") { state.published = f; reach("done"); }
  else if (f.type === "error") state.errors.push(f);
};
ws.onerror = () => state.errors.push("websocket error");
ws.onclose = (e) => { state.closed = e.code; };
</script></body></html>"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_subscribes_receives_acks_and_publishes() {
    let env = Env::for_pages().await;
    env.topic("browser", 1).await;
    let page = serve_page(PAGE.replace("__ADDR__", &env.addr.to_string())).await;
    let mut browser = Browser::open(&format!("http://{page}/")).await;
    browser
        .wait_until("typeof window.rgWait === 'function'", "null")
        .await;
    browser.eval("window.rgWait('subscribed')").await;

    for (i, tag) in ["a", "b", "c"].into_iter().enumerate() {
        let m = CoreMessage::new("browser", 0, format!("hello {i}").into_bytes())
            .with_tags(tag)
            .with_keys(["k1"])
            .with_property("source", "core");
        env.broker.send(m, QueueChoice::RoundRobin).await.unwrap();
    }
    browser.eval("window.rgWait('done')").await;
    let state = browser
        .eval("JSON.stringify({received: rg.received, errors: rg.errors, published: rg.published})")
        .await;
    let state: Value = serde_json::from_str(state.as_str().unwrap()).unwrap();
    assert_eq!(state["errors"], json!([]), "{state}");
    let bodies: Vec<&str> = state["received"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies, ["hello 0", "hello 1", "hello 2"]);
    assert_eq!(state["received"][1]["tag"], "b");
    assert_eq!(state["received"][1]["keys"], json!(["k1"]));
    assert_eq!(state["received"][1]["props"], json!({"source": "core"}));
    assert_eq!(state["published"]["topic"], "browser-out");

    // The acks reached the broker: the subscriber's committed offset is past all three.
    let committed = tokio::time::timeout(WAIT, async {
        loop {
            let o = env
                .broker
                .query_offset("chromium", "page", "browser", 0)
                .await
                .unwrap();
            if o == Some(3) {
                return o;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the page's acks are committed");
    assert_eq!(committed, Some(3));
    // And what the page published is in the log.
    let out = env
        .broker
        .pull(PullRequest {
            group: "check".into(),
            member: String::new(),
            topic: "browser-out".into(),
            queue_id: state["published"]["queue_id"].as_u64().unwrap() as u32,
            offset: 0,
            max_messages: 1,
            filter: Filter::all(),
            wait: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!(
        out.messages[0].view().unwrap().body(),
        b"hello from chromium"
    );
}

/// The copy-pasteable snippet of `docs/websocket.md`, pasted into a page as is
/// (only the address changed): it must publish, subscribe, receive and ack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_browser_snippet_works() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/websocket.md"
    ))
    .unwrap();
    let start = doc
        .find("```js\n")
        .expect("a js snippet in docs/websocket.md")
        + 6;
    let snippet = &doc[start..start + doc[start..].find("```").unwrap()];
    let env = Env::for_pages().await;
    let html = format!(
        "<!doctype html><html><body><script>\nwindow.logged = [];\n\
         console.log = (...a) => window.logged.push(a);\n\
         console.warn = (...a) => window.logged.push(['WARN', ...a]);\n{}\n</script></body></html>",
        snippet.replace("127.0.0.1:8083", &env.addr.to_string())
    );
    let page = serve_page(html).await;
    let mut browser = Browser::open(&format!("http://{page}/")).await;
    browser
        .wait_until("(window.logged || []).length > 0", "null")
        .await;
    let logged = browser.eval("JSON.stringify(window.logged)").await;
    let logged: Value = serde_json::from_str(logged.as_str().unwrap()).unwrap();
    assert_eq!(
        logged[0],
        json!(["hello", "hi from the console", {"unit": "C"}, "attempt", 1]),
        "{logged}"
    );
    // Its ack reached the broker: the subscriber's offsets cover both messages
    // ("first" before it subscribed at latest, and the one it received and acked).
    let committed = tokio::time::timeout(WAIT, async {
        loop {
            let mut sum = 0;
            for q in 0..4 {
                sum += env
                    .broker
                    .query_offset("console", "tab1", "demo", q)
                    .await
                    .unwrap()
                    .unwrap_or(0);
            }
            if sum == 2 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(committed.is_ok(), "the snippet's ack was not committed");
}
