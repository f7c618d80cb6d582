//! A headless Chromium with one page open, driven over the DevTools protocol (one
//! browser WebSocket, flat sessions), and a tiny HTTP server for the test's pages.
//!
//! Chromium is installed by `scripts/install-test-deps`; without it [`Browser::open`]
//! fails the test with that hint rather than skipping it.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

/// How long a page may take for anything (a cold, busy CI machine).
pub const PAGE_WAIT: Duration = Duration::from_secs(60);

/// The Chromium binary on `PATH`; panics with the installation hint when there is none.
pub fn chromium() -> String {
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

/// Serves each `(path, content type, body)` to GETs of that path (404 otherwise),
/// until the test's runtime ends.
pub async fn serve(files: Vec<(&'static str, &'static str, Vec<u8>)>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let files = Arc::new(files);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let files = files.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]);
                let path = request.split_whitespace().nth(1).unwrap_or("/");
                let (status, ctype, body): (&str, &str, &[u8]) =
                    match files.iter().find(|(p, _, _)| *p == path) {
                        Some((_, ctype, body)) => ("200 OK", ctype, body),
                        None => ("404 Not Found", "text/plain", b"not found"),
                    };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(body).await;
            });
        }
    });
    addr
}

/// Serves one HTML page at `/`.
pub async fn serve_page(html: String) -> std::net::SocketAddr {
    serve(vec![("/", "text/html", html.into_bytes())]).await
}

/// A headless Chromium with one page open; the browser is killed when this drops.
pub struct Browser {
    _child: tokio::process::Child,
    _profile: tempfile::TempDir,
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next: u64,
    session: String,
}

impl Browser {
    /// Starts Chromium and opens `url`. The page may still be loading when this
    /// returns: [`Browser::wait_until`] and [`Browser::eval`] cope with that.
    pub async fn open(url: &str) -> Browser {
        Self::open_with_args(url, &[]).await
    }

    /// [`Browser::open`] with extra Chromium flags (e.g.
    /// `--ignore-certificate-errors-spki-list=…` to trust a test server's key).
    pub async fn open_with_args(url: &str, extra: &[String]) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--no-first-run",
                "--no-default-browser-check",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(extra)
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting chromium");
        let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        let devtools = tokio::time::timeout(PAGE_WAIT, async {
            while let Ok(Some(line)) = stderr.next_line().await {
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
        let mut browser = Browser {
            _child: child,
            _profile: profile,
            ws,
            next: 0,
            session: String::new(),
        };
        let target = browser
            .call(false, "Target.createTarget", json!({"url": url}))
            .await["targetId"]
            .as_str()
            .unwrap()
            .to_owned();
        browser.session = browser
            .call(
                false,
                "Target.attachToTarget",
                json!({"targetId": target, "flatten": true}),
            )
            .await["sessionId"]
            .as_str()
            .unwrap()
            .to_owned();
        browser
    }

    async fn call(&mut self, in_page: bool, method: &str, params: Value) -> Value {
        match self.try_call(in_page, method, params).await {
            Ok(v) => v,
            Err(e) => panic!("{method}: {e}"),
        }
    }

    /// A DevTools call: its `result`, or its `error`.
    async fn try_call(
        &mut self,
        in_page: bool,
        method: &str,
        params: Value,
    ) -> Result<Value, Value> {
        self.next += 1;
        let mut req = json!({"id": self.next, "method": method, "params": params});
        if in_page {
            req["sessionId"] = json!(self.session);
        }
        self.ws.send(Message::text(req.to_string())).await.unwrap();
        loop {
            let msg = tokio::time::timeout(PAGE_WAIT + Duration::from_secs(30), self.ws.next())
                .await
                .expect("a DevTools answer in time")
                .expect("DevTools connection open")
                .unwrap();
            if let Message::Text(t) = msg {
                let v: Value = serde_json::from_str(&t).unwrap();
                if v["id"] == json!(self.next) {
                    return match v.get("error") {
                        Some(e) => Err(e.clone()),
                        None => Ok(v["result"].clone()),
                    };
                }
            }
        }
    }

    /// Evaluates `expr` in the page (awaiting a promise) and returns its JSON value.
    /// While the page is still navigating its execution context goes away under
    /// us: that is retried (the page has [`PAGE_WAIT`] to settle).
    pub async fn eval(&mut self, expr: &str) -> Value {
        let deadline = tokio::time::Instant::now() + PAGE_WAIT;
        let params = json!({"expression": expr, "awaitPromise": true, "returnByValue": true});
        loop {
            match self
                .try_call(true, "Runtime.evaluate", params.clone())
                .await
            {
                Ok(r) => {
                    assert!(r.get("exceptionDetails").is_none(), "{expr}: {r}");
                    return r["result"]["value"].clone();
                }
                Err(e)
                    if e.to_string().contains("context")
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("Runtime.evaluate: {e}"),
            }
        }
    }

    /// Waits (inside the page, re-checking every 25 ms) until `cond` is true, then
    /// returns `JSON.parse(JSON.stringify(result))`; fails after [`PAGE_WAIT`]
    /// with what `result` was then. The page may still be loading at first: a
    /// `cond` that throws counts as false.
    pub async fn wait_until(&mut self, cond: &str, result: &str) -> Value {
        let expr = format!(
            "new Promise((resolve) => {{
               const ok = () => {{ try {{ return !!({cond}); }} catch (e) {{ return false; }} }};
               const value = () => {{ try {{ return JSON.stringify({result}); }} catch (e) {{ return String(e); }} }};
               const start = Date.now();
               const tick = () => ok() ? resolve([true, value()])
                 : Date.now() - start > {ms} ? resolve([false, value()])
                 : setTimeout(tick, 25);
               tick();
             }})",
            ms = PAGE_WAIT.as_millis()
        );
        let out = self.eval(&expr).await;
        let value = out[1].as_str().unwrap_or("null");
        assert_eq!(
            out[0],
            json!(true),
            "the page never got to `{cond}`: {value}"
        );
        serde_json::from_str(value).unwrap_or(Value::Null)
    }
}
