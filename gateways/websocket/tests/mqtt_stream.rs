//! `/mqtt`: the WebSocket as a byte stream for another protocol's server,
//! exercised with an echo handler over a real WebSocket.

mod support;

use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use rocketgate_websocket::{Hooks, Settings, WsByteStream};
use support::{Env, WAIT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

fn echo(io: WsByteStream, _peer: std::net::SocketAddr, _tls_identity: Option<String>) {
    tokio::spawn(async move {
        let (mut r, mut w) = tokio::io::split(io);
        let mut buf = [0u8; 4096];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if w.write_all(&buf[..n]).await.is_err() || w.flush().await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = w.shutdown().await;
    });
}

#[tokio::test]
async fn bytes_split_across_frames_come_back_through_the_stream_handler() {
    let hooks = Hooks {
        mqtt: Some(Arc::new(echo)),
        ..Hooks::default()
    };
    let env = Env::with(Settings::default(), hooks).await;
    let mut request = format!("ws://{}/mqtt", env.addr)
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", "mqtt".parse().unwrap());
    let (mut ws, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(
        response
            .headers()
            .get("sec-websocket-protocol")
            .map(|v| v.to_str().unwrap()),
        Some("mqtt"),
        "MQTT.js needs the subprotocol echoed"
    );

    // An MQTT PINGREQ-sized packet and more, cut at odd places.
    let sent: Vec<u8> = (0u8..=255).cycle().take(10_000).collect();
    for part in [&sent[..1], &sent[1..3], &sent[3..4000], &sent[4000..]] {
        ws.send(Message::binary(part.to_vec())).await.unwrap();
    }
    let mut got = Vec::new();
    while got.len() < sent.len() {
        match tokio::time::timeout(WAIT, ws.next()).await.unwrap() {
            Some(Ok(Message::Binary(b))) => got.extend_from_slice(&b),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(got, sent);

    // A close from the client reads as end of stream; the handler shuts down and
    // the close handshake completes.
    ws.close(None).await.unwrap();
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await.unwrap() {
            Some(Ok(Message::Close(_))) | None => break,
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn stopping_the_server_ends_the_byte_streams() {
    let hooks = Hooks {
        mqtt: Some(Arc::new(echo)),
        ..Hooks::default()
    };
    let mut env = Env::with(Settings::default(), hooks).await;
    let mut request = format!("ws://{}/mqtt", env.addr)
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", "mqtt".parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    ws.send(Message::binary(vec![0xC0, 0x00])).await.unwrap();
    assert!(matches!(
        tokio::time::timeout(WAIT, ws.next()).await.unwrap(),
        Some(Ok(Message::Binary(b))) if b[..] == [0xC0, 0x00]
    ));
    env.stop().await;
    // The handler sees end of stream and closes its side.
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await.unwrap() {
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
            Some(Ok(_)) => {}
        }
    }
}
