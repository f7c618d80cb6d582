//! Enhanced authentication (MQTT 5 AUTH, SCRAM-SHA-256) through the socket: what
//! the Python conformance cases (`py/conformance.py`, `--node auth`) do not cover:
//! a user whose password predates SCRAM support, an exchange or a
//! re-authentication the client never finishes (bounded by `connect_timeout`),
//! failed SCRAM logins slowing down like failed passwords, and rumqttc's v5 client
//! against a method the broker does not offer and a broker with authentication off.
//! The client side of SCRAM here is `rocketgate_auth::scram::client_final`; the
//! Python suite's is an independent one (hashlib).

mod support;

use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use mqttbytes::v5::{self, ConnectReturnCode, Packet};
use rocketgate_auth::{Auth, UserEntry, scram, store};
use rumqttc::v5 as c5;
use support::{Node, Raw, WAIT};
use tokio::io::AsyncReadExt;

const METHOD: &str = "SCRAM-SHA-256";

fn auth(dir: &std::path::Path) -> std::sync::Arc<Auth> {
    let mut s = rocketgate_auth::Settings::disabled();
    s.enabled = true;
    s.users_file = dir.join("users.toml");
    s.failed_login_burst = 2;
    let auth = Auth::open(s).unwrap();
    auth.update(|f| {
        let mut sam = UserEntry {
            name: "sam".into(),
            roles: vec!["admin".into()],
            ..UserEntry::default()
        };
        store::set_password(&mut sam, b"sam-pw");
        f.upsert(sam);
        // A user whose password was set before SCRAM support: an argon2id hash only.
        f.upsert(UserEntry {
            name: "old".into(),
            password: store::hash_password(b"old-pw"),
            roles: vec!["admin".into()],
            ..UserEntry::default()
        });
    })
    .unwrap();
    auth
}

async fn node(dir: &std::path::Path) -> Node {
    let mut s = support::settings(dir);
    s.auth = auth(dir);
    s.connect_timeout = Duration::from_secs(1);
    Node::start_with(dir, s).await
}

fn auth_packet(reason: u8, data: &[u8]) -> Vec<u8> {
    let mut props = vec![0x15, 0, METHOD.len() as u8];
    props.extend_from_slice(METHOD.as_bytes());
    props.extend_from_slice(&[0x16, 0, data.len() as u8]);
    props.extend_from_slice(data);
    let mut out = vec![0xF0, (2 + props.len()) as u8, reason, props.len() as u8];
    out.extend_from_slice(&props);
    out
}

/// The next packet as (type, body); `None` when the server closed.
async fn frame(raw: &mut Raw) -> Option<(u8, Bytes)> {
    tokio::time::timeout(WAIT, async {
        loop {
            if raw.buf.len() >= 2 && raw.buf[1] < 0x80 {
                let size = 2 + usize::from(raw.buf[1]);
                if raw.buf.len() >= size {
                    let kind = raw.buf[0] >> 4;
                    raw.buf.advance(2);
                    return Some((kind, raw.buf.split_to(size - 2).freeze()));
                }
            }
            match raw.sock.read_buf(&mut raw.buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("a packet or the close in time")
}

/// An AUTH body's reason and Authentication Data.
fn auth_data(body: &[u8]) -> (u8, Vec<u8>) {
    let (reason, mut p) = (body[0], &body[2..]);
    while !p.is_empty() {
        let n = usize::from(u16::from_be_bytes([p[1], p[2]]));
        if p[0] == 0x16 {
            return (reason, p[3..3 + n].to_vec());
        }
        p = &p[3 + n..];
    }
    (reason, Vec::new())
}

/// A CONNACK's reason code and Authentication Data.
fn connack(body: Bytes) -> (ConnectReturnCode, Option<Bytes>) {
    let mut b = BytesMut::new();
    b.extend_from_slice(&[0x20, body.len() as u8]);
    b.extend_from_slice(&body);
    match v5::read(&mut b, 1 << 16) {
        Ok(Packet::ConnAck(a)) => (a.code, a.properties.and_then(|p| p.authentication_data)),
        other => panic!("not a CONNACK: {other:?}"),
    }
}

/// CONNECT with SCRAM for `user`: the raw connection after the server's AUTH
/// 0x18, the client-first-bare and the server-first message.
async fn start(node: &Node, id: &str, user: &str) -> (Raw, String, Vec<u8>) {
    let bare = format!("n={user},r=nonce-{id}");
    let mut props = support::connect_props();
    props.authentication_method = Some(METHOD.into());
    props.authentication_data = Some(Bytes::from(format!("n,,{bare}")));
    let mut raw = Raw::connect(node.addr).await;
    let mut c = v5::Connect::new(id);
    c.keep_alive = 60;
    c.properties = Some(props);
    raw.send(Packet::Connect(c)).await;
    let (kind, body) = frame(&mut raw).await.expect("AUTH");
    assert_eq!(kind, 15, "AUTH expected");
    let (reason, server_first) = auth_data(&body);
    assert_eq!(reason, 0x18);
    (raw, bare, server_first)
}

/// A whole SCRAM login: the CONNACK's code and Authentication Data, and the
/// server-final message to expect.
async fn login(
    node: &Node,
    id: &str,
    user: &str,
    pw: &str,
) -> (Raw, ConnectReturnCode, Option<Bytes>, String) {
    let (mut raw, bare, server_first) = start(node, id, user).await;
    let (client_final, expect) = scram::client_final(pw.as_bytes(), &bare, &server_first).unwrap();
    raw.send_bytes(&auth_packet(0x18, client_final.as_bytes()))
        .await;
    let (kind, body) = frame(&mut raw).await.expect("CONNACK");
    assert_eq!(kind, 2, "CONNACK expected");
    let (code, data) = connack(body);
    (raw, code, data, expect)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_keys_unfinished_exchanges_and_back_off() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;

    // A good login: CONNACK 0x00 with the server-final message.
    let (_raw, code, data, expect) = login(&node, "sam-1", "sam", "sam-pw").await;
    assert_eq!(code, ConnectReturnCode::Success);
    assert_eq!(data.as_deref(), Some(expect.as_bytes()));

    // A user without SCRAM keys: refused like a wrong password; its password still works.
    let (mut raw, code, data, _) = login(&node, "old-1", "old", "old-pw").await;
    assert_eq!(code, ConnectReturnCode::BadUserNamePassword);
    assert!(data.is_none());
    assert!(frame(&mut raw).await.is_none(), "closed after the refusal");
    let mut raw = Raw::connect(node.addr).await;
    let mut c = v5::Connect::new("old-2");
    c.login = Some(v5::Login::new("old", "old-pw"));
    raw.send(Packet::Connect(c)).await;
    assert!(
        matches!(raw.recv().await, Some(Packet::ConnAck(a)) if a.code == ConnectReturnCode::Success)
    );

    // An exchange the client never finishes: CONNACK 0x87 after `connect_timeout`.
    let (mut raw, _, _) = start(&node, "stuck", "sam").await;
    let (kind, body) = frame(&mut raw).await.expect("CONNACK");
    assert_eq!(
        (kind, connack(body).0),
        (2, ConnectReturnCode::NotAuthorized)
    );
    assert!(frame(&mut raw).await.is_none());

    // A re-authentication the client never finishes: DISCONNECT 0x87.
    let (mut raw, code, _, _) = login(&node, "sam-2", "sam", "sam-pw").await;
    assert_eq!(code, ConnectReturnCode::Success);
    raw.send_bytes(&auth_packet(0x19, b"n,,n=sam,r=again"))
        .await;
    let (kind, body) = frame(&mut raw).await.expect("AUTH");
    assert_eq!((kind, auth_data(&body).0), (15, 0x18));
    let (kind, body) = frame(&mut raw).await.expect("DISCONNECT");
    assert_eq!((kind, body[0]), (14, 0x87));

    // Failed SCRAM logins count for the back-off (burst 2 here): after three in a
    // row, the next exchange is held back (100 ms x 2) before the server answers.
    for i in 0..3 {
        let (_, code, _, _) = login(&node, &format!("bad-{i}"), "sam", "wrong").await;
        assert_eq!(code, ConnectReturnCode::BadUserNamePassword);
    }
    let at = Instant::now();
    let (_raw, _, _) = start(&node, "after-failures", "sam").await;
    assert!(
        at.elapsed() >= Duration::from_millis(150),
        "no back-off after failed SCRAM logins: {:?}",
        at.elapsed()
    );
    // A good login clears it.
    let (_raw, code, _, _) = login(&node, "sam-3", "sam", "sam-pw").await;
    assert_eq!(code, ConnectReturnCode::Success);
    node.stop().await;
}

async fn rumqttc_refusal(node: &Node, method: &str) -> c5::mqttbytes::v5::ConnectReturnCode {
    let mut o = c5::MqttOptions::new("rumqttc-auth", "127.0.0.1", node.port());
    o.set_authentication_method(Some(method.into()));
    o.set_authentication_data(Some(Bytes::from_static(b"n,,n=sam,r=abc")));
    let (_client, mut el) = c5::AsyncClient::new(o, 10);
    match tokio::time::timeout(WAIT, el.poll())
        .await
        .expect("an answer in time")
    {
        Err(c5::ConnectionError::ConnectionRefused(code)) => code,
        other => panic!("expected a refused connection, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rumqttc_is_told_bad_authentication_method() {
    use c5::mqttbytes::v5::ConnectReturnCode as R;
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;
    assert_eq!(
        rumqttc_refusal(&node, "KERBEROS").await,
        R::BadAuthenticationMethod
    );
    node.stop().await;
    // Authentication off: no method is offered, SCRAM included.
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    assert_eq!(
        rumqttc_refusal(&node, METHOD).await,
        R::BadAuthenticationMethod
    );
    node.stop().await;
}
