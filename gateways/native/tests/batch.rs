//! `SEND_BATCH_MESSAGE` and single sends through the server's pre-encoded path: the
//! properties a producer sends are what the commit log stores, byte for byte, and
//! what a pull returns; what is not in the stored form is parsed the Java way.

mod common;

use bytes::{Bytes, BytesMut};
use common::Node;
use rocketgate_core::store::RecordView;
use rocketgate_core::store::record::CRC32_PROPERTY_LEN;
use rocketgate_native::message::{ReceivedMessage, encode_batch_entry};
use rocketgate_remoting::body::pull_flag;
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::codec::RemotingCommand;

fn send_v2(topic: &str, queue: i32, props: &str, body: Bytes) -> RemotingCommand {
    RemotingCommand::request(request::SEND_MESSAGE_V2, 0)
        .with_field("a", "pg")
        .with_field("b", topic)
        .with_field("e", queue)
        .with_field("f", 0)
        .with_field("g", 1_700_000_000_000i64)
        .with_field("h", 0)
        .with_field("i", props)
        .with_body(body)
}

/// A batch request of `(flag, body, properties)` entries to queue `queue`.
fn batch(topic: &str, queue: i32, entries: &[(i32, &[u8], &[u8])]) -> RemotingCommand {
    let mut body = BytesMut::new();
    for (flag, b, props) in entries {
        // The codec's encoder takes a &str; write raw (maybe non-UTF-8) bytes by hand.
        let size = 20 + b.len() + 2 + props.len();
        body.extend_from_slice(&(size as i32).to_be_bytes());
        body.extend_from_slice(&[0; 8]);
        body.extend_from_slice(&flag.to_be_bytes());
        body.extend_from_slice(&(b.len() as i32).to_be_bytes());
        body.extend_from_slice(b);
        body.extend_from_slice(&(props.len() as i16).to_be_bytes());
        body.extend_from_slice(props);
    }
    let mut req = send_v2(topic, queue, "", body.freeze()).with_field("m", true);
    req.code = request::SEND_BATCH_MESSAGE;
    req
}

fn pull(topic: &str, queue: u32) -> RemotingCommand {
    RemotingCommand::request(request::PULL_MESSAGE, 0)
        .with_field("consumerGroup", "g")
        .with_field("topic", topic)
        .with_field("queueId", queue)
        .with_field("queueOffset", 0)
        .with_field("maxMsgNums", 32)
        .with_field("sysFlag", pull_flag::SUBSCRIPTION)
        .with_field("commitOffset", 0)
        .with_field("suspendTimeoutMillis", 0)
        .with_field("subscription", "*")
        .with_field("subVersion", 0)
        .with_field("expressionType", "TAG")
}

/// Every record of a pull body: (flag, body, properties without the store's CRC).
fn records(body: &Bytes) -> Vec<(i32, Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut rest = &body[..];
    while !rest.is_empty() {
        let view = RecordView::parse(rest).unwrap();
        view.verify_strict().unwrap();
        let raw = view.properties_raw();
        out.push((
            view.flag(),
            view.body().to_vec(),
            raw[..raw.len() - CRC32_PROPERTY_LEN].to_vec(),
        ));
        rest = &rest[view.total_size() as usize..];
    }
    out
}

#[tokio::test]
async fn batch_entries_with_tags_keys_and_properties_are_stored_as_sent() {
    let node = Node::start().await;
    let mut c = node.conn().await;
    let entries: [(i32, &[u8], &[u8]); 3] = [
        (
            1,
            b"first",
            "TAGS\u{1}tagA\u{2}KEYS\u{1}k1 k2\u{2}région\u{1}été\u{2}UNIQ_KEY\u{1}U1\u{2}"
                .as_bytes(),
        ),
        (0, b"", b""),
        (7, b"\x00\xff binary", b"UNIQ_KEY\x01U3\x02WAIT\x01true\x02"),
    ];
    let r = c.ask(batch("B", 1, &entries)).await;
    assert_eq!(r.code, response::SUCCESS, "{r:?}");
    assert_eq!(r.field("queueOffset"), Some("0"));
    assert_eq!(r.field("msgId").unwrap().split(',').count(), 3);
    node.settle().await;

    let p = c.ask(pull("B", 1)).await;
    assert_eq!(p.code, response::SUCCESS, "{p:?}");
    let got = records(&p.body);
    let want: Vec<(i32, Vec<u8>, Vec<u8>)> = entries
        .iter()
        .map(|(f, b, props)| (*f, b.to_vec(), props.to_vec()))
        .collect();
    assert_eq!(got, want);
    let msgs = ReceivedMessage::decode_all(&p.body).unwrap();
    assert_eq!(msgs[0].tag(), Some("tagA"));
    assert_eq!(msgs[0].keys(), vec!["k1", "k2"]);
    assert_eq!(msgs[0].property("région"), Some("été"));
    assert_eq!(msgs[2].msg_id, "U3");
    // Keys and unique keys were indexed as for any send.
    let by_key = node
        .broker
        .store()
        .query_by_key("B", "k2", 0, i64::MAX, 10)
        .unwrap();
    assert_eq!(by_key.len(), 1);
}

#[tokio::test]
async fn properties_not_in_the_stored_form_are_parsed_like_java() {
    let node = Node::start().await;
    let mut c = node.conn().await;
    // No final separator, a repeated name (the last wins), a malformed item.
    let entries: [(i32, &[u8], &[u8]); 2] = [
        (0, b"a", b"TAGS\x01x\x02junk\x02TAGS\x01y\x02KEYS\x01k"),
        (0, b"b", b"TAGS\x01z\x02"),
    ];
    let r = c.ask(batch("J", 0, &entries)).await;
    assert_eq!(r.code, response::SUCCESS, "{r:?}");
    // A single send's header properties the same way.
    let r = c
        .ask(send_v2(
            "J",
            0,
            "TAGS\u{1}s\u{2}TAGS\u{1}t",
            Bytes::from_static(b"c"),
        ))
        .await;
    assert_eq!(r.code, response::SUCCESS, "{r:?}");
    node.settle().await;
    let got = records(&c.ask(pull("J", 0)).await.body);
    let props: Vec<&[u8]> = got.iter().map(|(_, _, p)| p.as_slice()).collect();
    assert_eq!(
        props,
        vec![
            &b"TAGS\x01y\x02KEYS\x01k\x02"[..],
            b"TAGS\x01z\x02",
            b"TAGS\x01t\x02",
        ]
    );
}

#[tokio::test]
async fn batches_refuse_delays_transactions_and_bad_text() {
    let node = Node::start().await;
    let mut c = node.conn().await;
    let refused: [&[u8]; 3] = [b"DELAY\x013\x02", b"TRAN_MSG\x01true\x02", b"A\x01\xff\x02"];
    for props in refused {
        for n in [1, 2] {
            let entries: Vec<(i32, &[u8], &[u8])> = (0..n).map(|_| (0, &b"x"[..], props)).collect();
            let r = c.ask(batch("R", 0, &entries)).await;
            assert_eq!(r.code, response::MESSAGE_ILLEGAL, "{props:?} x{n}: {r:?}");
        }
    }
    // Nothing was stored, and a plain batch still goes through.
    let r = c.ask(batch("R", 0, &[(0, b"ok", b"")])).await;
    assert_eq!(r.code, response::SUCCESS, "{r:?}");
    assert_eq!(r.field("queueOffset"), Some("0"));
    // A single send may be delayed: it is stored in the delay topic, not in R yet.
    let r = c
        .ask(send_v2(
            "R",
            0,
            "DELAY\u{1}3\u{2}",
            Bytes::from_static(b"later"),
        ))
        .await;
    assert_eq!(r.code, response::SUCCESS, "{r:?}");
    node.settle().await;
    assert_eq!(records(&c.ask(pull("R", 0)).await.body).len(), 1);
}

#[test]
fn the_codec_batch_encoder_matches_the_hand_written_entries() {
    let mut ours = BytesMut::new();
    encode_batch_entry(5, b"body", "A\u{1}1\u{2}", &mut ours);
    let req = batch("T", 0, &[(5, b"body", b"A\x011\x02")]);
    assert_eq!(req.body, ours.freeze());
}
