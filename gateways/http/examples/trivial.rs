//! The ceiling for `bench/http`: an axum server on the same stack as the
//! gateway (axum, hyper, tokio multi-thread) whose publish handler reads the body
//! and answers 201 with a small JSON, storing nothing.
//!
//! `cargo run --release -p rocketgate-http --example trivial -- 127.0.0.1:18080`

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::routing::post;
use axum::serve::ListenerExt;

async fn publish(body: Bytes) -> (StatusCode, axum::Json<serde_json::Value>) {
    let json = serde_json::json!({
        "msg_id": "7F00000100002A9F0000000000000000",
        "topic": "t",
        "queue_id": 0,
        "queue_offset": body.len(),
    });
    (StatusCode::CREATED, axum::Json(json))
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18080".into());
    let app = Router::new().route("/v1/topics/{topic}/messages", post(publish));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("trivial listening on {}", listener.local_addr()?);
    // Same socket options as the gateway (TCP_NODELAY), so the ceiling is like for like.
    let listener = listener.tap_io(|s| {
        let _ = s.set_nodelay(true);
    });
    axum::serve(listener, app).await
}
