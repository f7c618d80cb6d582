//! `tls.namesrv` end to end, as separate processes: a NameServer serving TLS only, a
//! broker registering with it through `namesrv.ca`, and our Rust client finding the
//! route over TLS and sending through it. A client without the CA gets no route; a
//! broker without it never registers (its queues are in no route).

use std::time::{Duration, Instant};

use interop_tests::Node;
use interop_tests::cluster::BROKER_DOORS;
use interop_tests::pki::Pki;
use rocketgate_native::client::{ClientSettings, Message, Producer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_and_clients_reach_a_tls_namesrv_only_with_its_ca() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = Pki::new(dir.path(), "unused")?;
    let mut env = pki.env();
    env.push(("ROCKETGATE_TLS__NAMESRV".into(), "true".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let ns = Node::launch(&["namesrv"], &["namesrv"], &env)?;
    let namesrv = ns.addr("namesrv").to_string();
    let ca = pki.path("ca.pem");
    let ca_env = ca.display().to_string();

    // A broker with the CA registers; one without it cannot (a TLS-only port).
    let _good = Node::launch(
        &["broker", "--namesrv", &namesrv, "--name", "broker-tls"],
        &BROKER_DOORS,
        &[("ROCKETGATE_NAMESRV__CA", &ca_env)],
    )?;
    let _plain = Node::launch(
        &["broker", "--namesrv", &namesrv, "--name", "broker-plain"],
        &BROKER_DOORS,
        &[],
    )?;

    // Our client with the CA finds a route and sends through it. The first send of a
    // new topic goes to a broker the NameServer lists (the broker creates the topic);
    // the ones after it follow the topic's route.
    let with_ca = ClientSettings::new([namesrv.clone()])
        .with_namesrv_tls_ca(&ca)?
        .with_request_timeout(Duration::from_secs(3));
    let producer = Producer::start(with_ca, "tls-p").await?;
    let until = Instant::now() + Duration::from_secs(30);
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
        let r = producer.send(Message::new("over-tls", "again")).await?;
        assert_eq!(r.queue.broker_name, "broker-tls", "{r:?}");
    }

    // A client without the CA finds no route: its send fails, clearly, in time.
    let plain = ClientSettings::new([namesrv.clone()]).with_request_timeout(Duration::from_secs(2));
    let producer = Producer::start(plain, "plain-p").await?;
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
    Ok(())
}
