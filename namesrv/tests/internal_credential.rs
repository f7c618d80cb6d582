//! With authentication on, the NameServer's writes need the internal credential:
//! an anonymous UNREGISTER_BROKER (which used to empty the cluster view) and a
//! registration signed by an ordinary user are refused with NO_PERMISSION, while a
//! broker signing with the internal credential registers. Route queries and topic
//! lists follow the ACL: unsigned ones are refused, a user sees the route of a topic
//! it may publish or subscribe to, and only admin / monitor users list topics.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use rocketgate_auth::{AccessKey, Action, Auth, Rule, UserEntry, sign};
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
        Arc::new(|| {
            ["T", "a", "b", "c", "%RETRY%g1"]
                .into_iter()
                .map(|t| WireTopicConfig::new(t, 4))
                .collect()
        }),
    )
    .with_signer(signer)
    .spawn()
}

/// `cmd` signed with `ak`/`sk` and sent.
async fn signed_call(
    addr: std::net::SocketAddr,
    mut cmd: RemotingCommand,
    ak: &'static str,
    sk: &'static str,
) -> RemotingCommand {
    signer(ak, sk)(&mut cmd);
    call(addr, &cmd).await
}

/// Broker names in the route of `topic`, asked as the admin `alice`.
async fn brokers_in_route(addr: std::net::SocketAddr, topic: &str) -> Vec<String> {
    let r = signed_call(addr, route_request(topic), "alice-ak", "alice-sk").await;
    if r.code == response::TOPIC_NOT_EXIST {
        return Vec::new();
    }
    assert_eq!(r.code, response::SUCCESS, "{:?}", r.remark);
    let data: rocketgate_remoting::protocol::TopicRouteData =
        rocketgate_remoting::protocol::from_json(&r.body).unwrap();
    let mut names: Vec<String> = data
        .broker_datas
        .into_iter()
        .map(|b| b.broker_name)
        .collect();
    names.sort();
    names
}

fn auth_with_users(dir: &std::path::Path) -> Arc<Auth> {
    let mut s = rocketgate_auth::Settings::disabled();
    s.enabled = true;
    s.users_file = dir.join("users.toml");
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
        });
        f.upsert(UserEntry {
            name: "bob".into(),
            access_keys: vec![AccessKey {
                access_key: "bob-ak".into(),
                secret_key: "bob-sk".into(),
            }],
            rules: vec![
                Rule::allow(&[Action::Publish], &["a/x"]),
                Rule {
                    groups: vec!["g1".into()],
                    ..Rule::allow(&[Action::Subscribe], &["c/#"])
                },
            ],
            ..UserEntry::default()
        });
    })
    .unwrap();
    auth
}

#[tokio::test]
async fn writes_need_the_internal_credential() {
    let dir = tempfile::tempdir().unwrap();
    let auth = auth_with_users(dir.path());
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

#[tokio::test]
async fn route_queries_and_topic_lists_follow_the_acl() {
    let dir = tempfile::tempdir().unwrap();
    let auth = auth_with_users(dir.path());
    let (ns, addr) = NameServer::bind("127.0.0.1:0".parse().unwrap(), short_expiry())
        .await
        .unwrap();
    let ns = ns.with_auth(auth).spawn();
    let broker = registrar("broker-a", addr, signer("rocketgate-internal", "isecret"));
    eventually("the broker in the route", || async {
        brokers_in_route(addr, "a").await == ["broker-a"]
    })
    .await;

    // Anonymous: no route, no topic list; the cluster view (no topics) stays open.
    let anon = call(addr, &route_request("a")).await;
    assert_eq!(anon.code, response::NO_PERMISSION, "{:?}", anon.remark);
    assert!(
        anon.remark
            .as_deref()
            .unwrap_or("")
            .contains("must be signed"),
        "{:?}",
        anon.remark
    );
    let list = RemotingCommand::request(request::GET_ALL_TOPIC_LIST_FROM_NAMESERVER, 1);
    assert_eq!(call(addr, &list).await.code, response::NO_PERMISSION);
    let by_cluster = RemotingCommand::request(request::GET_TOPICS_BY_CLUSTER, 1)
        .with_field("cluster", "DefaultCluster");
    assert_eq!(call(addr, &by_cluster).await.code, response::NO_PERMISSION);
    let cluster = RemotingCommand::request(request::GET_BROKER_CLUSTER_INFO, 1);
    assert_eq!(call(addr, &cluster).await.code, response::SUCCESS);

    // bob: the topics he may publish (a, by one tag) or consume (c, and his group's
    // retry topic) route; b, another group's retry topic and a topic that does not
    // exist are refused alike (a refusal does not tell whether it exists).
    for (topic, code) in [
        ("a", response::SUCCESS),
        ("c", response::SUCCESS),
        ("%RETRY%g1", response::SUCCESS),
        ("b", response::NO_PERMISSION),
        ("%RETRY%g2", response::NO_PERMISSION),
        ("nope", response::NO_PERMISSION),
    ] {
        let r = signed_call(addr, route_request(topic), "bob-ak", "bob-sk").await;
        assert_eq!(r.code, code, "{topic}: {:?}", r.remark);
    }
    let wrong = signed_call(addr, route_request("a"), "bob-ak", "guess").await;
    assert_eq!(wrong.code, response::NO_PERMISSION);
    let r = signed_call(addr, list.clone(), "bob-ak", "bob-sk").await;
    assert_eq!(r.code, response::NO_PERMISSION, "{:?}", r.remark);
    assert!(r.remark.unwrap_or_default().contains("admin or monitor"));

    // The admin lists every topic; the internal credential reads routes too.
    let r = signed_call(addr, list, "alice-ak", "alice-sk").await;
    assert_eq!(r.code, response::SUCCESS, "{:?}", r.remark);
    let body = String::from_utf8_lossy(&r.body);
    assert!(body.contains("\"b\"") && body.contains("\"c\""), "{body}");
    let r = signed_call(addr, route_request("b"), "rocketgate-internal", "isecret").await;
    assert_eq!(r.code, response::SUCCESS, "{:?}", r.remark);
    broker.stop().await;
    ns.stop().await;
}
