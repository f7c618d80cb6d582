//! With authentication on, the NameServer's writes need the internal credential:
//! an anonymous UNREGISTER_BROKER (which used to empty the cluster view) and a
//! registration signed by an ordinary user are refused with NO_PERMISSION, while a
//! broker signing with the internal credential registers; route queries stay open.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use rocketgate_auth::{AccessKey, Auth, UserEntry, sign};
use rocketgate_namesrv::NameServer;
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::protocol::WireTopicConfig;
use rocketgate_remoting::{BrokerIdentity, Registrar, RemotingCommand};

fn signer(ak: &'static str, sk: &'static str) -> rocketgate_remoting::Signer {
    Arc::new(move |cmd: &mut RemotingCommand| {
        cmd.ext_fields.insert(sign::ACCESS_KEY, ak.to_owned());
        let sig = sign::signature(sk.as_bytes(), cmd.ext_fields.iter(), &cmd.body);
        cmd.ext_fields.insert(sign::SIGNATURE, sig);
    })
}

fn registrar(
    name: &str,
    ns: std::net::SocketAddr,
    signer: rocketgate_remoting::Signer,
) -> rocketgate_remoting::RegistrarHandle {
    Registrar::new(
        BrokerIdentity {
            cluster: "DefaultCluster".into(),
            name: name.into(),
            id: 0,
            addr: "127.0.0.1:10911".into(),
            ha_addr: String::new(),
        },
        vec![ns.to_string()],
        Duration::from_millis(200),
        Arc::new(|| vec![WireTopicConfig::new("T", 4)]),
    )
    .with_signer(signer)
    .spawn()
}

#[tokio::test]
async fn writes_need_the_internal_credential() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = rocketgate_auth::Settings::disabled();
    s.enabled = true;
    s.users_file = dir.path().join("users.toml");
    s.internal = Some(AccessKey {
        access_key: "rocketgate-internal".into(),
        secret_key: "isecret".into(),
    });
    let auth = Auth::open(s).unwrap();
    auth.update(|f| {
        f.upsert(UserEntry {
            name: "alice".into(),
            access_keys: vec![AccessKey {
                access_key: "alice-ak".into(),
                secret_key: "alice-sk".into(),
            }],
            roles: vec!["admin".into()],
            ..UserEntry::default()
        })
    })
    .unwrap();
    let (ns, addr) = NameServer::bind("127.0.0.1:0".parse().unwrap(), short_expiry())
        .await
        .unwrap();
    let ns = ns.with_auth(auth).spawn();

    let good = registrar("broker-a", addr, signer("rocketgate-internal", "isecret"));
    eventually("the signed broker in the route", || async {
        brokers_in_route(addr, "T").await == ["broker-a"]
    })
    .await;
    let user = registrar("broker-b", addr, signer("alice-ak", "alice-sk"));
    let forged = registrar("broker-c", addr, signer("rocketgate-internal", "guess"));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        brokers_in_route(addr, "T").await,
        ["broker-a"],
        "only the internal credential registers"
    );

    let mut unregister = RemotingCommand::request(request::UNREGISTER_BROKER, 1);
    for (k, v) in [
        ("brokerName", "broker-a"),
        ("brokerAddr", "127.0.0.1:10911"),
        ("clusterName", "DefaultCluster"),
        ("brokerId", "0"),
    ] {
        unregister.ext_fields.insert(k.to_owned(), v.to_owned());
    }
    let resp = call(addr, &unregister).await;
    assert_eq!(resp.code, response::NO_PERMISSION, "{:?}", resp.remark);
    assert!(
        resp.remark
            .unwrap_or_default()
            .contains("internal credential")
    );
    assert_eq!(brokers_in_route(addr, "T").await, ["broker-a"]);
    user.abort().await;
    forged.abort().await;
    good.stop().await;
    ns.stop().await;
}
