//! The fuzz targets of rocketgate, as plain functions (issue #25 item 7).
//!
//! Each function takes arbitrary bytes and checks the properties its parser or state
//! machine owes: never a panic, bounded buffering, and where there is an encoder, that
//! what was read writes back to the same thing. Two drivers call them:
//!
//! - `fuzz/libfuzzer` — cargo-fuzz binaries, one per target (`scripts/fuzz` runs them
//!   with a nightly toolchain and keeps what they find in `fuzz/corpus/<target>`);
//! - `fuzz/tests/corpus.rs` — the test suite replays every stored corpus file through
//!   the same function, so a crash once found stays fixed.
//!
//! | target | input | what it checks |
//! |---|---|---|
//! | `remoting_decode` | remoting frames in chunks | no panic, bounded buffer, decode∘encode = id |
//! | `auth` | frames, JWTs, topic filters | signatures verify and fail on change, no panic |
//! | `mqtt_codec` | MQTT 3.1.1 / 5 packets in chunks | no panic, bounded buffer, read∘write = id |
//! | `mqtt_session` | bytes after a CONNECT, to a live server | no server panic, server still answers |
//! | `ws_json` | WebSocket text frames | every frame answers `Ok` or a coded error |
//! | `http_json` | HTTP request bodies and fields | bodies parse or fail cleanly, no panic |
//! | `sql92` | SQL92 selectors + properties | parse, evaluate, no panic / stack overflow |
//! | `record` | commit-log records | parse any bytes; encode∘parse = id for messages |
//! | `recovery` | a commit-log segment's bytes | recovery never panics, keeps only valid records |

#![forbid(unsafe_code)]

pub mod seeds;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

use bytes::BytesMut;
use rocketgate_auth::acl::{filter_covers, filter_matches, filters_overlap};
use rocketgate_auth::{Action, Grant, Placeholders, Rule, jwt, sign};
use rocketgate_core::broker::filter::{Filter, FilterType};
use rocketgate_core::store::commit_log::{CommitLog, CommitLogSettings, Recovery};
use rocketgate_core::store::record::{self, Message, RecordView, Stamp};
use rocketgate_remoting::FrameCodec;

/// A fuzz target: takes any bytes, panics when a property does not hold.
pub type Target = fn(&[u8]);

/// Every target by name, for the replay test and the driver script.
pub const TARGETS: &[(&str, Target)] = &[
    ("remoting_decode", remoting_decode),
    ("auth", auth),
    ("mqtt_codec", mqtt_codec),
    ("mqtt_session", mqtt_session),
    ("ws_json", ws_json),
    ("http_json", http_json),
    ("sql92", sql92),
    ("record", record),
    ("recovery", recovery),
];

/// Arbitrary bytes to the remoting frame decoder in arbitrary chunk sizes (the first
/// byte picks the size). Properties: no panic, no unbounded buffering, and every
/// decoded command re-encodes to a frame that decodes to the same command.
pub fn remoting_decode(data: &[u8]) {
    let codec = FrameCodec::new(64 * 1024);
    let Some((chunk, data)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(*chunk).max(1);
    let mut buf = BytesMut::new();
    for piece in data.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(cmd)) => {
                    let mut again = BytesMut::new();
                    if codec.encode(&cmd, &mut again).is_ok() {
                        let back = codec
                            .decode(&mut again)
                            .expect("re-decode")
                            .expect("whole frame");
                        assert_eq!(back, cmd);
                        assert!(again.is_empty());
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        assert!(buf.len() <= 4 + codec.max_frame_len() + chunk);
    }
}

/// The authentication paths: a decoded frame's fields and body through the signature
/// check, arbitrary text as a JWT, and arbitrary topic names and filters through the
/// ACL matcher. A frame signed with the right secret verifies; with one body byte
/// changed it does not.
pub fn auth(data: &[u8]) {
    let mut buf = BytesMut::from(data);
    if let Ok(Some(mut cmd)) = FrameCodec::new(64 * 1024).decode(&mut buf) {
        let fields: Vec<(&str, &str)> = cmd.ext_fields.iter().collect();
        let given = cmd.field(sign::SIGNATURE).unwrap_or("");
        let _ = sign::verify(b"secret", fields.iter().copied(), &cmd.body, given);
        cmd.ext_fields.insert(sign::ACCESS_KEY, "ak".to_owned());
        let sig = sign::signature(b"secret", cmd.ext_fields.iter(), &cmd.body);
        cmd.ext_fields.insert(sign::SIGNATURE, sig.clone());
        let fields: Vec<(&str, &str)> = cmd.ext_fields.iter().collect();
        assert!(sign::verify(
            b"secret",
            fields.iter().copied(),
            &cmd.body,
            &sig
        ));
        let mut body = cmd.body.to_vec();
        body.push(0);
        assert!(!sign::verify(
            b"secret",
            fields.iter().copied(),
            &body,
            &sig
        ));
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(Some(keys)) = jwt::Keys::new(Some(b"k"), None, "sub") {
            let _ = keys.verify(text);
        }
        let mid = (0..=text.len() / 2)
            .rev()
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(0);
        let (a, b) = text.split_at(mid);
        let _ = (
            filter_matches(a, b),
            filter_covers(a, b),
            filters_overlap(a, b),
        );
        let rules = [Rule::allow(&[Action::Publish, Action::Subscribe], &[a])];
        let g = Grant::new(
            &rules,
            Placeholders {
                username: b,
                clientid: a,
            },
        );
        let _ = (g.may_publish(b), g.may_subscribe(b, Some(a)), g.may_admin());
    }
}

/// MQTT packets as a connection reads them: the first byte picks the version (bit 0)
/// and the chunk size, the second the packet size limit. See
/// `rocketgate_mqtt::fuzz::codec_roundtrip` for the properties.
pub fn mqtt_codec(data: &[u8]) {
    let [first, second, rest @ ..] = data else {
        return;
    };
    let v5 = first & 1 == 1;
    let chunk = usize::from(first >> 1).max(1);
    let max = 16 + usize::from(*second) * 64;
    rocketgate_mqtt::fuzz::codec_roundtrip(v5, chunk, max, rest);
}

/// A live MQTT server (one per process, over a small store in a temp dir) fed
/// arbitrary bytes after a valid CONNECT (first byte bit 0: MQTT 5, else 3.1.1).
/// Properties: no task of the server panics (the process aborts on any panic), and
/// after the connection ends a fresh client still gets a CONNACK: one bad client
/// cannot stop or wedge the server.
pub fn mqtt_session(data: &[u8]) {
    let Some((first, rest)) = data.split_first() else {
        return;
    };
    let server = mqtt_server();
    let v5 = first & 1 == 1;
    let Ok(mut conn) = TcpStream::connect(server) else {
        panic!("the MQTT server stopped accepting connections");
    };
    let _ = conn.set_read_timeout(Some(Duration::from_millis(20)));
    let _ = conn.set_nodelay(true);
    let _ = conn.write_all(&connect_packet(v5, "fuzz"));
    // The rest in up to four writes, split where the first byte says.
    let cut = usize::from(first >> 1).min(rest.len());
    for part in [&rest[..cut], &rest[cut..]] {
        if conn.write_all(part).is_err() {
            break;
        }
    }
    let mut sink = [0u8; 4096];
    for _ in 0..4 {
        match conn.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    drop(conn);
    // The probe: a fresh client gets its CONNACK within 5 s.
    if let Err(failed) = connack_within(server, v5, Duration::from_secs(5)) {
        // Slow or wedged? Ask once more, longer, so the report says which.
        let second = connack_within(server, v5, Duration::from_secs(60));
        panic!(
            "the server did not answer a CONNECT within 5 s after this input ({failed}; \
             a second CONNECT: {})",
            match second {
                Ok(t) => format!("answered after {t:?}"),
                Err(e) => e,
            }
        );
    }
}

/// How long a fresh connection to `server` waited for its CONNACK, or why it got
/// none. A read interrupted by a signal is read again: libFuzzer's `-timeout`
/// watchdog is a SIGALRM every second, and a blocking read it lands in returns
/// EINTR — taken for a silent server, it was this target's only finding in three
/// long runs (2026-12-03 and -07; the second CONNECT was always answered in
/// milliseconds).
fn connack_within(server: SocketAddr, v5: bool, timeout: Duration) -> Result<Duration, String> {
    let started = std::time::Instant::now();
    let mut c = TcpStream::connect(server).map_err(|e| format!("connect: {e}"))?;
    c.write_all(&connect_packet(v5, "fuzz-probe"))
        .map_err(|e| format!("write: {e}"))?;
    let mut head = [0u8; 1];
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(format!("no CONNACK within {timeout:?}"));
        }
        let _ = c.set_read_timeout(Some(left));
        return match c.read(&mut head) {
            Ok(1) if head[0] == 0x20 => Ok(started.elapsed()),
            Ok(0) => Err(format!("closed after {:?}", started.elapsed())),
            Ok(_) => Err(format!("first byte {:#04x}", head[0])),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => Err(format!("no CONNACK after {:?}: {e}", started.elapsed())),
        };
    }
}

/// A CONNECT with clean start, keep-alive 60 and `client_id`.
fn connect_packet(v5: bool, client_id: &str) -> Vec<u8> {
    let mut body = vec![
        0,
        4,
        b'M',
        b'Q',
        b'T',
        b'T',
        if v5 { 5 } else { 4 },
        0x02,
        0,
        60,
    ];
    if v5 {
        body.push(0); // no properties
    }
    body.extend_from_slice(&(client_id.len() as u16).to_be_bytes());
    body.extend_from_slice(client_id.as_bytes());
    let mut packet = vec![0x10, body.len() as u8];
    packet.extend_from_slice(&body);
    packet
}

/// The name of the threads the `mqtt_session` target's server runs on.
const SERVER_THREAD: &str = "fuzz-mqtt-server";

fn mqtt_server() -> SocketAddr {
    static SERVER: OnceLock<SocketAddr> = OnceLock::new();
    *SERVER.get_or_init(|| {
        // A panic on the server's threads (a task, which tokio would otherwise
        // swallow) must end the process, so the fuzzer sees it as a crash. Panics
        // elsewhere (another target's, in the replay test) stay ordinary panics.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            if std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with(SERVER_THREAD))
            {
                std::process::abort();
            }
        }));
        // `FUZZ_LOG=rocketgate_mqtt=debug` (a tracing filter): the server's log on
        // stderr, to see what led to a finding.
        if let Ok(filter) = std::env::var("FUZZ_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .try_init();
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(SERVER_THREAD.into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name(SERVER_THREAD)
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let dir = tempfile::tempdir().expect("temp dir");
                    let (_handle, addr) = start_mqtt(dir.path()).await;
                    tx.send(addr).expect("report address");
                    // Keep the server and its directory for the life of the process.
                    std::future::pending::<()>().await;
                    drop(dir);
                });
            })
            .expect("start the MQTT server thread");
        rx.recv().expect("the MQTT server did not start")
    })
}

async fn start_mqtt(
    dir: &std::path::Path,
) -> (
    rocketgate_mqtt::Handle<rocketgate_core::broker::Broker>,
    SocketAddr,
) {
    use rocketgate_core::broker::{Broker, BrokerSettings, SystemClock};
    use rocketgate_core::store::{FlushMode, Store, StoreDeps, StoreSettings};
    use std::sync::Arc;
    let settings = StoreSettings {
        segment_size: 4 * 1024 * 1024,
        max_message_size: 64 * 1024,
        flush: FlushMode::Async {
            interval: Duration::from_millis(50),
        },
        consume_queue_entries_per_file: 4096,
        index_slots: 256,
        index_entries_per_file: 1024,
        ..StoreSettings::default()
    };
    let store = Arc::new(
        Store::open(dir, settings, StoreDeps::fixed_usage(0.1))
            .expect("store")
            .0,
    );
    let broker = Arc::new(
        Broker::open(store, BrokerSettings::default(), Arc::new(SystemClock)).expect("broker"),
    );
    let mut mqtt = rocketgate_mqtt::Settings::new(dir.join("mqtt"));
    mqtt.max_packet_size = 16 * 1024;
    let (server, addr) =
        rocketgate_mqtt::Server::bind("127.0.0.1:0".parse().expect("addr"), broker, mqtt)
            .await
            .expect("bind");
    (server.spawn(), addr)
}

/// A WebSocket text frame through the request parser: every frame is a request or a
/// coded error, never a panic.
pub fn ws_json(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Err(code) = rocketgate_websocket::fuzz::parse_frame(&text) {
        assert!(!code.is_empty());
    }
}

/// HTTP request bodies: a batch publish and the admin bodies, parsed as the handlers
/// parse them; each batch entry's body decoded and its properties and keys checked.
pub fn http_json(data: &[u8]) {
    use rocketgate_http::publish::BatchEntry;
    use rocketgate_http::wire;
    if let Ok(entries) = serde_json::from_slice::<Vec<BatchEntry>>(data) {
        for e in entries {
            let _ = wire::decode_body(&e.body, e.body_encoding.as_deref(), "body");
            for (k, v) in &e.properties {
                let _ = wire::check_property(k, v);
            }
            let _ = wire::parse_keys(&e.keys.join(" "));
        }
    }
    let _ = serde_json::from_slice::<rocketgate_http::admin::CreateTopic>(data);
    let _ = serde_json::from_slice::<rocketgate_http::admin::UpdateTopic>(data);
    let _ = serde_json::from_slice::<rocketgate_http::admin::ResetOffsets>(data);
    let _ = serde_json::from_slice::<rocketgate_http::admin::Resend>(data);
    let _ = serde_json::from_slice::<rocketgate_http::admin::GroupSettings>(data);
    let _ = serde_json::from_slice::<rocketgate_http::consume::HandlesBody>(data);
    let _ = serde_json::from_slice::<rocketgate_http::consume::InvisibilityBody>(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = wire::parse_keys(text);
        let (name, value) = text.split_once('=').unwrap_or((text, ""));
        let _ = wire::check_property(name, value);
        let _ = wire::decode_body(text, Some("base64"), "body");
    }
}

/// An SQL92 selector (text before the first NUL) evaluated against properties
/// (`name=value` lines after it). Parsing bounds its nesting, so no input overflows
/// the stack; evaluation never panics.
pub fn sql92(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (expr, props) = text.split_once('\0').unwrap_or((&text, ""));
    let props: BTreeMap<&str, &str> = props.lines().filter_map(|l| l.split_once('=')).collect();
    for kind in [FilterType::Sql92, FilterType::Tag] {
        if let Ok(filter) = Filter::parse(kind, expr) {
            let tag = props.get("TAGS").copied();
            let _ = filter.matches_with(tag, |name| props.get(name).copied());
        }
    }
}

pub(crate) const STORE_HOST: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::new(127, 0, 0, 1),
    10911,
));

/// Commit-log records: arbitrary bytes parsed as a record (every accessor read,
/// CRCs checked — no panic); and a message built from the input encodes to a record
/// that parses back to the same topic, body and properties and verifies.
pub fn record(data: &[u8]) {
    if let Ok(view) = RecordView::parse(data) {
        touch(&view);
        let _ = view.verify();
        let _ = view.verify_strict();
    }
    let _ = record::read_header(data);
    // A message from the input: topic, then body, split at the first NUL.
    let (topic, body) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&b"t"[..], data),
    };
    let topic: String = String::from_utf8_lossy(topic)
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .take(127)
        .collect();
    let topic = if topic.is_empty() { "t".into() } else { topic };
    let tag = String::from_utf8_lossy(&body[..body.len().min(8)])
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>();
    let mut msg = Message::new(topic.clone(), 0, body.to_vec());
    if !tag.is_empty() {
        msg = msg.with_tags(tag.clone());
    }
    let mut out = Vec::new();
    let Ok(encoded) = record::encode(&msg, &STORE_HOST, &mut out) else {
        return;
    };
    encoded
        .stamp(
            &mut out,
            &Stamp {
                queue_offset: 7,
                phys_offset: 4096,
                store_timestamp: 1_700_000_000_000,
            },
        )
        .expect("stamp a record just encoded");
    let view = RecordView::parse(&out).expect("a record just encoded parses");
    view.verify_strict()
        .expect("a record just encoded verifies");
    assert_eq!(view.topic(), topic);
    assert_eq!(view.body(), body);
    assert_eq!(view.queue_offset(), 7);
    assert_eq!(view.phys_offset(), 4096);
    if !tag.is_empty() {
        let tags = view
            .properties()
            .find(|(k, _)| *k == "TAGS")
            .map(|(_, v)| v);
        assert_eq!(tags, Some(tag.as_str()));
    }
}

fn touch(view: &RecordView<'_>) {
    let _ = (
        view.total_size(),
        view.body_crc(),
        view.queue_id(),
        view.flag(),
        view.queue_offset(),
        view.phys_offset(),
        view.sys_flag(),
        view.born_timestamp(),
        view.born_host(),
        view.store_timestamp(),
        view.store_host(),
        view.reconsume_times(),
        view.prepared_transaction_offset(),
        view.body().len(),
        view.topic().len(),
        view.properties_raw().len(),
        view.stored_record_crc(),
    );
    let _ = view.properties().count();
}

/// The input as the first commit-log segment of a log, then recovery (full, with no
/// checkpoint). Properties: recovery never panics; what it keeps is a sequence of
/// records that parse and verify, ending at the recovered end; and a record appended
/// after recovery reads back.
pub fn recovery(data: &[u8]) {
    const SEGMENT: u64 = 64 * 1024;
    let Ok(dir) = tempfile::tempdir() else {
        return;
    };
    let log_dir = dir.path().join("commitlog");
    std::fs::create_dir_all(&log_dir).expect("create log dir");
    let mut segment = data[..data.len().min(SEGMENT as usize)].to_vec();
    segment.resize(SEGMENT as usize, 0);
    std::fs::write(log_dir.join(format!("{:020}", 0)), &segment).expect("write segment");
    let settings = CommitLogSettings {
        segment_size: SEGMENT,
        max_message_size: 16 * 1024,
        write_through: false,
        store_host: STORE_HOST,
    };
    let Ok((log, _report)) = CommitLog::open(&log_dir, settings, Recovery::Full) else {
        return;
    };
    let end = log.max_offset();
    let mut at = log.min_offset();
    while at < end {
        let within = (at % SEGMENT) as usize;
        if at < SEGMENT
            && let Ok(record::Header::Blank { .. }) = record::read_header(&segment[within..])
        {
            // The end-of-segment filler: the log goes on in the next segment.
            at = SEGMENT;
            continue;
        }
        let rec = log
            .read_at(at)
            .unwrap_or_else(|e| panic!("recovery kept an unreadable record at {at}: {e}"));
        let view = RecordView::parse(&rec).expect("a kept record parses");
        view.verify().expect("a kept record verifies");
        at += u64::from(view.total_size());
    }
    assert_eq!(at, end, "records kept do not end at the recovered end");
    let msg = Message::new("after", 0, &b"appended after recovery"[..]);
    if let Ok(appended) = log.append(&msg) {
        let rec = log
            .read_at(appended.phys_offset)
            .expect("read the appended record");
        let view = RecordView::parse(&rec).expect("appended record parses");
        assert_eq!(view.body(), b"appended after recovery");
    }
}
