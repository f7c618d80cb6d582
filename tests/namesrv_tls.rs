//! `tls.namesrv` end to end, as separate processes: a NameServer serving TLS only, a
//! broker registering with it through `namesrv.ca`, and our Rust client finding the
//! route over TLS and sending through it. A client without the CA gets no route; a
//! broker without it never registers (its topic has no route).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rocketgate_native::client::{ClientSettings, Message, Producer};

/// A process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A CA and a server certificate for 127.0.0.1 (rcgen): `ca.pem`, `server.pem`,
/// `server.key` in `dir`.
fn test_pki(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "namesrv test CA");
    std::fs::write(dir.join("ca.pem"), ca.self_signed(&ca_key).unwrap().pem()).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    std::fs::write(dir.join("server.pem"), server.pem()).unwrap();
    std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
}

/// Starts `rocketgate ARGS` with `env` and waits for its "ready" line; returns the
/// process and the address its `door` listens on.
fn start(args: &[&str], env: &[(&str, String)], door: &str) -> (Proc, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rocketgate"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut addr = None;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.contains(" ready") {
            break;
        }
        if let Some(a) = line
            .strip_prefix(&format!("rocketgate: {door} listening on "))
            .map(str::to_owned)
        {
            addr = Some(a);
        }
    }
    let addr = addr.unwrap_or_else(|| panic!("{door} did not say where it listens"));
    (Proc(child), addr)
}

fn broker(namesrv: &str, name: &str, data: &Path, env: &[(&str, String)]) -> Proc {
    let data = data.to_str().unwrap();
    let args = [
        "broker",
        "--name",
        name,
        "--namesrv",
        namesrv,
        "--data-dir",
        data,
        "--native",
        "0",
        "--mqtt",
        "0",
        "--http",
        "0",
        "--ws",
        "0",
    ];
    start(&args, env, "native").0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_and_clients_reach_a_tls_namesrv_only_with_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    test_pki(dir.path());
    let file = |n: &str| dir.path().join(n).to_str().unwrap().to_owned();
    let tls = [
        ("ROCKETGATE_TLS__NAMESRV", "true".to_owned()),
        ("ROCKETGATE_TLS__CERT", file("server.pem")),
        ("ROCKETGATE_TLS__KEY", file("server.key")),
    ];
    let (_ns, namesrv) = start(&["namesrv", "--namesrv", "0"], &tls, "namesrv");

    // A broker with the CA registers; one without it cannot (a TLS-only port).
    let _good = broker(
        &namesrv,
        "broker-tls",
        &dir.path().join("good"),
        &[("ROCKETGATE_NAMESRV__CA", file("ca.pem"))],
    );
    let _plain = broker(&namesrv, "broker-plain", &dir.path().join("plain"), &[]);

    // Our client with the CA finds a route and sends through it.
    let with_ca = ClientSettings::new([namesrv.clone()])
        .with_namesrv_tls_ca(&dir.path().join("ca.pem"))
        .unwrap()
        .with_request_timeout(Duration::from_secs(3));
    let producer = Producer::start(with_ca.clone(), "tls-p").await.unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    // The first send of a new topic goes to a broker the NameServer lists (the
    // broker creates the topic); the ones after it follow the topic's route.
    loop {
        match producer.send(Message::new("over-tls", "hello")).await {
            Ok(r) if !r.queue.broker_name.is_empty() => break,
            Ok(_) => {}
            Err(e) => assert!(
                Instant::now() < until,
                "no route over the TLS NameServer: {e}"
            ),
        }
        assert!(Instant::now() < until, "the topic never got a route");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every queue of the route is the registered broker's: the plain one never
    // registered (it only ever reached a TLS port in plain text).
    for _ in 0..16 {
        let r = producer
            .send(Message::new("over-tls", "again"))
            .await
            .unwrap();
        assert_eq!(r.queue.broker_name, "broker-tls", "{r:?}");
    }

    // A client without the CA finds no route: its send fails, clearly, in time.
    let plain = ClientSettings::new([namesrv.clone()]).with_request_timeout(Duration::from_secs(2));
    let producer = Producer::start(plain, "plain-p").await.unwrap();
    let started = Instant::now();
    let err = producer
        .send(Message::new("over-tls", "nope"))
        .await
        .expect_err("a plain client must not get a route from a TLS-only NameServer");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the failure took {:?}",
        started.elapsed()
    );
    eprintln!("plain client: {err}");
}
