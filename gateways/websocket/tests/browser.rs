//! End to end in headless Chromium: a page served by the test opens
//! `ws://127.0.0.1:PORT/v1/ws`, subscribes, receives what the test publishes
//! through the core, acks each message (and gives credit back one at a time),
//! then publishes a message of its own. The test drives Chromium through the
//! DevTools protocol over a WebSocket and reads the page's state.
//!
//! Chromium is required: without it this test fails (it is installed by
//! `scripts/install-test-deps`). The same page against the whole node, fed by
//! `curl` and `mosquitto_pub`, and MQTT.js over `/mqtt`, are in
//! `interop-tests/tests/browser.rs`.

mod support;

use std::process::Stdio;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use rocketgate_core::broker::filter::Filter;
use rocketgate_core::broker::{MessagingApi, PullRequest, QueueChoice};
use rocketgate_core::store::Message as CoreMessage;
use serde_json::{Value, json};
use support::{Env, WAIT};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

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

fn chromium() -> String {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(out) = std::process::Command::new("which").arg(name).output()
            && out.status.success()
        {
            return String::from_utf8_lossy(&out.stdout).trim().to_owned();
        }
    }
    panic!(
        "Chromium is not installed: run scripts/install-test-deps (it installs the `chromium` package)"
    );
}

/// Serves `page` to every GET, until the test ends.
async fn serve_page(page: String) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let page = page.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                    page.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

/// A minimal DevTools client: one browser WebSocket, flat sessions.
struct Cdp {
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next: u64,
}

impl Cdp {
    async fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next += 1;
        let mut req = json!({"id": self.next, "method": method, "params": params});
        if let Some(s) = session {
            req["sessionId"] = json!(s);
        }
        self.ws.send(Message::text(req.to_string())).await.unwrap();
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(60), self.ws.next())
                .await
                .expect("a DevTools answer in time")
                .expect("DevTools connection open")
                .unwrap();
            if let Message::Text(t) = msg {
                let v: Value = serde_json::from_str(&t).unwrap();
                if v["id"] == json!(self.next) {
                    assert!(v.get("error").is_none(), "{method}: {v}");
                    return v["result"].clone();
                }
            }
        }
    }

    /// Evaluates `expr` in the page (awaiting a promise) and returns its JSON value.
    async fn eval(&mut self, session: &str, expr: &str) -> Value {
        let r = self
            .call(
                Some(session),
                "Runtime.evaluate",
                json!({"expression": expr, "awaitPromise": true, "returnByValue": true}),
            )
            .await;
        assert!(r.get("exceptionDetails").is_none(), "{expr}: {r}");
        r["result"]["value"].clone()
    }
}

/// A headless Chromium with one page open, driven over DevTools.
struct Browser {
    _child: tokio::process::Child,
    _profile: tempfile::TempDir,
    cdp: Cdp,
    session: String,
}

impl Browser {
    /// Starts Chromium and opens `url`; returns once the page's scripts have run
    /// far enough that `ready_expr` is true.
    async fn open(url: &str, ready_expr: &str) -> Browser {
        let binary = chromium();
        let profile = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new(&binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting chromium");
        let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        let devtools = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = stderr.next_line().await.unwrap() {
                if let Some(at) = line.find("ws://") {
                    return line[at..].trim().to_owned();
                }
            }
            panic!("chromium exited without a DevTools address");
        })
        .await
        .expect("chromium announces its DevTools address");
        // Keep draining chromium's stderr so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });

        let (ws, _) = tokio_tungstenite::connect_async(devtools.as_str())
            .await
            .unwrap();
        let mut cdp = Cdp { ws, next: 0 };
        let target = cdp
            .call(None, "Target.createTarget", json!({"url": url}))
            .await["targetId"]
            .as_str()
            .unwrap()
            .to_owned();
        let session = cdp
            .call(
                None,
                "Target.attachToTarget",
                json!({"targetId": target, "flatten": true}),
            )
            .await["sessionId"]
            .as_str()
            .unwrap()
            .to_owned();
        // The page may still be loading: poll until its script has set things up.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if cdp.eval(&session, ready_expr).await == json!(true) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the page never got ready: {ready_expr}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Browser {
            _child: child,
            _profile: profile,
            cdp,
            session,
        }
    }

    async fn eval(&mut self, expr: &str) -> Value {
        self.cdp.eval(&self.session, expr).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_subscribes_receives_acks_and_publishes() {
    let env = Env::start().await;
    env.topic("browser", 1).await;
    let page = serve_page(PAGE.replace("__ADDR__", &env.addr.to_string())).await;
    let mut browser = Browser::open(
        &format!("http://{page}/"),
        "typeof window.rgWait === 'function'",
    )
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
    let env = Env::start().await;
    let html = format!(
        "<!doctype html><html><body><script>\nwindow.logged = [];\n\
         console.log = (...a) => window.logged.push(a);\n\
         console.warn = (...a) => window.logged.push(['WARN', ...a]);\n{}\n</script></body></html>",
        snippet.replace("127.0.0.1:8083", &env.addr.to_string())
    );
    let page = serve_page(html).await;
    let mut browser = Browser::open(
        &format!("http://{page}/"),
        "(window.logged || []).length > 0",
    )
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
