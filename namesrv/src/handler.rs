//! Turns one decoded request into its response against the NameServer [`State`]. Pure:
//! no I/O, the time comes in as an argument.

use std::time::Instant;

use rocketgate_remoting::RemotingCommand;
use rocketgate_remoting::code::{request, response, version};
use rocketgate_remoting::protocol::{
    self, KvTable, RegisterBrokerBody, TopicConfigWrapper, TopicList, field,
};
use serde::Serialize;

use crate::kv::KvConfig;
use crate::routes::{ConnId, Registration, RouteTable};

/// The KV namespace whose table is returned to a registering broker.
const ORDER_TOPIC_CONFIG: &str = "ORDER_TOPIC_CONFIG";

/// Everything a NameServer knows.
#[derive(Debug)]
pub struct State {
    pub routes: RouteTable,
    pub kv: KvConfig,
}

/// A request that cannot be answered: its response code and remark.
struct Refusal(i32, String);

impl Refusal {
    fn missing(name: &str) -> Self {
        Refusal(
            response::SYSTEM_ERROR,
            format!("missing or invalid header field {name}"),
        )
    }
}

fn require<'a>(req: &'a RemotingCommand, name: &str) -> Result<&'a str, Refusal> {
    req.field(name).ok_or_else(|| Refusal::missing(name))
}

/// Answers `req`, which arrived on connection `conn` at `now`.
pub fn handle(
    state: &mut State,
    req: &RemotingCommand,
    conn: ConnId,
    now: Instant,
) -> RemotingCommand {
    let ok = RemotingCommand::response_to(req, response::SUCCESS);
    let result = match req.code {
        request::REGISTER_BROKER => register_broker(state, req, conn, now, ok),
        request::UNREGISTER_BROKER => unregister_broker(state, req, ok),
        request::BROKER_HEARTBEAT => broker_heartbeat(state, req, now, ok),
        request::GET_ROUTEINFO_BY_TOPIC => route_by_topic(state, req, ok),
        request::GET_BROKER_CLUSTER_INFO => {
            Ok(ok.with_body(encode_for(req, &state.routes.cluster_info())))
        }
        request::GET_ALL_TOPIC_LIST_FROM_NAMESERVER => {
            Ok(ok.with_body(protocol::to_json(&TopicList {
                broker_addr: None,
                topic_list: state.routes.topic_names(),
            })))
        }
        request::GET_TOPICS_BY_CLUSTER => require(req, field::CLUSTER).map(|cluster| {
            ok.with_body(protocol::to_json(&TopicList {
                broker_addr: None,
                topic_list: state.routes.topics_of_cluster(cluster),
            }))
        }),
        request::DELETE_TOPIC_IN_NAMESRV => require(req, field::TOPIC).map(|topic| {
            state
                .routes
                .delete_topic(topic, req.field(field::CLUSTER_NAME));
            ok
        }),
        request::PUT_KV_CONFIG => (|| {
            let ns = require(req, field::NAMESPACE)?;
            let key = require(req, field::KEY)?;
            let value = require(req, field::VALUE)?;
            state.kv.put(ns, key, value);
            Ok(ok)
        })(),
        request::GET_KV_CONFIG => (|| {
            let ns = require(req, field::NAMESPACE)?;
            let key = require(req, field::KEY)?;
            match state.kv.get(ns, key) {
                Some(v) => Ok(ok.with_field(field::VALUE, v)),
                None => Err(Refusal(
                    response::QUERY_NOT_FOUND,
                    format!("No config item, Namespace: {ns} Key: {key}"),
                )),
            }
        })(),
        request::DELETE_KV_CONFIG => (|| {
            let ns = require(req, field::NAMESPACE)?;
            let key = require(req, field::KEY)?;
            state.kv.delete(ns, key);
            Ok(ok)
        })(),
        request::GET_KVLIST_BY_NAMESPACE => {
            require(req, field::NAMESPACE).and_then(|ns| match state.kv.namespace(ns) {
                Some(t) => Ok(ok.with_body(protocol::to_json(&KvTable { table: t.clone() }))),
                None => Err(Refusal(
                    response::QUERY_NOT_FOUND,
                    format!("No config item, Namespace: {ns}"),
                )),
            })
        }
        code => Err(Refusal(
            response::REQUEST_CODE_NOT_SUPPORTED,
            format!("request type {code} not supported"),
        )),
    };
    result.unwrap_or_else(|Refusal(code, remark)| {
        RemotingCommand::response_to(req, code).with_remark(remark)
    })
}

/// Route and cluster bodies: standard JSON for clients from 4.9.4 on or that ask for it,
/// fastjson's bare numeric keys for older ones (as Java's NameServer does).
fn encode_for<T: Serialize>(req: &RemotingCommand, value: &T) -> Vec<u8> {
    let standard_only = req
        .field(field::ACCEPT_STANDARD_JSON_ONLY)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if standard_only || req.version >= version::V4_9_4 {
        protocol::to_json(value)
    } else {
        protocol::to_fastjson(value)
    }
}

fn route_by_topic(
    state: &State,
    req: &RemotingCommand,
    ok: RemotingCommand,
) -> Result<RemotingCommand, Refusal> {
    let topic = require(req, field::TOPIC)?;
    match state.routes.route(topic) {
        Some(route) => Ok(ok.with_body(encode_for(req, &route))),
        None => Err(Refusal(
            response::TOPIC_NOT_EXIST,
            format!("No topic route info in name server for the topic: {topic}"),
        )),
    }
}

fn register_broker(
    state: &mut State,
    req: &RemotingCommand,
    conn: ConnId,
    now: Instant,
    ok: RemotingCommand,
) -> Result<RemotingCommand, Refusal> {
    let broker_id = require(req, field::BROKER_ID)?
        .parse::<u64>()
        .map_err(|_| Refusal::missing(field::BROKER_ID))?;
    if req
        .field(field::COMPRESSED)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        return Err(Refusal(
            response::SYSTEM_ERROR,
            "compressed RegisterBrokerBody is not supported; set compressedRegister=false".into(),
        ));
    }
    let crc = req
        .field(field::BODY_CRC32)
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(0);
    if crc != 0 && crc != i64::from(protocol::body_crc32(&req.body)) {
        return Err(Refusal(response::SYSTEM_ERROR, "crc32 not match".into()));
    }
    let topics = if req.body.is_empty() {
        TopicConfigWrapper::default()
    } else if req.version >= version::V3_0_11 {
        protocol::from_json::<RegisterBrokerBody>(&req.body)
            .map(|b| b.topic_config_serialize_wrapper)
            .map_err(|e| bad_body(&e))?
    } else {
        protocol::from_json::<TopicConfigWrapper>(&req.body).map_err(|e| bad_body(&e))?
    };
    let registration = Registration {
        cluster: require(req, field::CLUSTER_NAME)?.to_string(),
        broker_name: require(req, field::BROKER_NAME)?.to_string(),
        broker_addr: require(req, field::BROKER_ADDR)?.to_string(),
        broker_id,
        ha_addr: req.field(field::HA_SERVER_ADDR).unwrap_or("").to_string(),
        topics,
    };
    let registered = state.routes.register(registration, conn, now);
    let mut resp = ok;
    if let Some(a) = registered.master_addr {
        resp = resp.with_field(field::MASTER_ADDR, a);
    }
    if let Some(a) = registered.master_ha_addr {
        resp = resp.with_field(field::HA_SERVER_ADDR, a);
    }
    if let Some(t) = state.kv.namespace(ORDER_TOPIC_CONFIG) {
        resp = resp.with_body(protocol::to_json(&KvTable { table: t.clone() }));
    }
    Ok(resp)
}

fn bad_body(e: &serde_json::Error) -> Refusal {
    Refusal(
        response::SYSTEM_ERROR,
        format!("malformed RegisterBrokerBody: {e}"),
    )
}

fn unregister_broker(
    state: &mut State,
    req: &RemotingCommand,
    ok: RemotingCommand,
) -> Result<RemotingCommand, Refusal> {
    let name = require(req, field::BROKER_NAME)?;
    let addr = require(req, field::BROKER_ADDR)?;
    state.routes.unregister(name, addr);
    Ok(ok)
}

fn broker_heartbeat(
    state: &mut State,
    req: &RemotingCommand,
    now: Instant,
    ok: RemotingCommand,
) -> Result<RemotingCommand, Refusal> {
    let addr = require(req, field::BROKER_ADDR)?;
    if state.routes.heartbeat(addr, now) {
        Ok(ok)
    } else {
        Err(Refusal(
            response::SYSTEM_ERROR,
            format!("broker {addr} is not registered"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rocketgate_remoting::protocol::{ClusterInfo, RegisterBrokerBody, WireTopicConfig};

    use super::*;

    fn state() -> State {
        State {
            routes: RouteTable::new(Duration::from_secs(120)),
            kv: KvConfig::default(),
        }
    }

    fn req(code: i32) -> RemotingCommand {
        RemotingCommand {
            version: version::CURRENT,
            ..RemotingCommand::request(code, 5)
        }
    }

    fn register(st: &mut State, name: &str, cluster: &str, topics: &[&str]) -> RemotingCommand {
        let mut body = RegisterBrokerBody::default();
        for t in topics {
            body.topic_config_serialize_wrapper
                .topic_config_table
                .insert(t.to_string(), WireTopicConfig::new(*t, 4));
        }
        let r = req(request::REGISTER_BROKER)
            .with_field(field::BROKER_NAME, name)
            .with_field(field::BROKER_ADDR, format!("{name}:10911"))
            .with_field(field::CLUSTER_NAME, cluster)
            .with_field(field::BROKER_ID, 0)
            .with_body(protocol::to_json(&body));
        handle(st, &r, 1, Instant::now())
    }

    #[test]
    fn kv_config_round_trip() {
        let mut st = state();
        let put = req(request::PUT_KV_CONFIG)
            .with_field(field::NAMESPACE, "ns")
            .with_field(field::KEY, "k")
            .with_field(field::VALUE, "v");
        assert_eq!(
            handle(&mut st, &put, 1, Instant::now()).code,
            response::SUCCESS
        );
        let get = req(request::GET_KV_CONFIG)
            .with_field(field::NAMESPACE, "ns")
            .with_field(field::KEY, "k");
        let got = handle(&mut st, &get, 1, Instant::now());
        assert_eq!(got.field(field::VALUE), Some("v"));
        let list = req(request::GET_KVLIST_BY_NAMESPACE).with_field(field::NAMESPACE, "ns");
        let table: KvTable =
            protocol::from_json(&handle(&mut st, &list, 1, Instant::now()).body).unwrap();
        assert_eq!(table.table["k"], "v");
        let del = req(request::DELETE_KV_CONFIG)
            .with_field(field::NAMESPACE, "ns")
            .with_field(field::KEY, "k");
        handle(&mut st, &del, 1, Instant::now());
        let gone = handle(&mut st, &get, 1, Instant::now());
        assert_eq!(gone.code, response::QUERY_NOT_FOUND);
        assert_eq!(
            gone.remark.as_deref(),
            Some("No config item, Namespace: ns Key: k")
        );
    }

    #[test]
    fn cluster_info_and_topic_lists() {
        let mut st = state();
        assert_eq!(
            register(&mut st, "broker-a", "c1", &["T", "A"]).code,
            response::SUCCESS
        );
        register(&mut st, "broker-x", "c2", &["T", "X"]);

        let info: ClusterInfo = protocol::from_json(
            &handle(
                &mut st,
                &req(request::GET_BROKER_CLUSTER_INFO),
                1,
                Instant::now(),
            )
            .body,
        )
        .unwrap();
        assert_eq!(
            info.broker_addr_table["broker-a"].broker_addrs[&0],
            "broker-a:10911"
        );
        assert!(info.cluster_addr_table["c2"].contains("broker-x"));

        let all: TopicList = protocol::from_json(
            &handle(
                &mut st,
                &req(request::GET_ALL_TOPIC_LIST_FROM_NAMESERVER),
                1,
                Instant::now(),
            )
            .body,
        )
        .unwrap();
        assert_eq!(all.topic_list.len(), 3);

        let by_cluster = req(request::GET_TOPICS_BY_CLUSTER).with_field(field::CLUSTER, "c2");
        let c2: TopicList =
            protocol::from_json(&handle(&mut st, &by_cluster, 1, Instant::now()).body).unwrap();
        assert_eq!(c2.topic_list.into_iter().collect::<Vec<_>>(), ["T", "X"]);

        let delete = req(request::DELETE_TOPIC_IN_NAMESRV).with_field(field::TOPIC, "X");
        assert_eq!(
            handle(&mut st, &delete, 1, Instant::now()).code,
            response::SUCCESS
        );
        let route = req(request::GET_ROUTEINFO_BY_TOPIC).with_field(field::TOPIC, "X");
        assert_eq!(
            handle(&mut st, &route, 1, Instant::now()).code,
            response::TOPIC_NOT_EXIST
        );
    }

    #[test]
    fn old_clients_get_bare_numeric_keys() {
        let mut st = state();
        register(&mut st, "broker-a", "c1", &["T"]);
        let mut route = req(request::GET_ROUTEINFO_BY_TOPIC).with_field(field::TOPIC, "T");
        route.version = 399;
        let body = handle(&mut st, &route, 1, Instant::now()).body;
        assert!(String::from_utf8_lossy(&body).contains(r#"{0:"broker-a:10911"}"#));
        let route = route.with_field(field::ACCEPT_STANDARD_JSON_ONLY, "true");
        let body = handle(&mut st, &route, 1, Instant::now()).body;
        assert!(String::from_utf8_lossy(&body).contains(r#"{"0":"broker-a:10911"}"#));
    }

    #[test]
    fn compressed_registration_is_refused_with_a_reason() {
        let mut st = state();
        let r = req(request::REGISTER_BROKER)
            .with_field(field::BROKER_NAME, "b")
            .with_field(field::BROKER_ADDR, "b:1")
            .with_field(field::CLUSTER_NAME, "c")
            .with_field(field::BROKER_ID, 0)
            .with_field(field::COMPRESSED, true)
            .with_body(&b"\x78\x9c"[..]);
        let resp = handle(&mut st, &r, 1, Instant::now());
        assert_eq!(resp.code, response::SYSTEM_ERROR);
        assert!(resp.remark.unwrap().contains("compressed"));
    }
}
