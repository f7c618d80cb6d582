//! A cluster on loopback for the proxy-mode tests (issue #29): two broker groups
//! (`broker-a`: a standalone node with the NameServer; `broker-b`: `rocketgate broker`)
//! and two proxies (`rocketgate proxy --namesrv …`: MQTT, HTTP and WebSocket doors with
//! no store of their own). Every node's `namesrv` address is the cluster's NameServer,
//! so the native door helpers of [`crate::doors`] (our client over the NameServer
//! routes) work with any of them, a proxy included.

use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::doors::{create_topic, curl};
use crate::{Node, wait_for};

/// Two broker groups and two proxies.
pub struct Cluster {
    /// `broker-a`: standalone, runs the NameServer.
    pub a: Node,
    /// `broker-b`: `rocketgate broker`, registered with `a`'s NameServer.
    pub b: Node,
    /// Proxy 1.
    pub p1: Node,
    /// Proxy 2.
    pub p2: Node,
}

/// The doors a proxy is given a listen flag for.
pub const PROXY_DOORS: [&str; 3] = ["mqtt", "http", "ws"];
/// The doors `rocketgate broker` is given a listen flag for.
pub const BROKER_DOORS: [&str; 4] = ["native", "mqtt", "http", "ws"];

impl Cluster {
    /// Starts broker-a, broker-b and the two proxies (each ready when this returns).
    pub fn start() -> anyhow::Result<Cluster> {
        let a = Node::start()?;
        let ns = a.addr("namesrv");
        let ns_s = ns.to_string();
        let mut b = Node::launch(
            &["broker", "--namesrv", &ns_s, "--name", "broker-b"],
            &BROKER_DOORS,
            &[],
        )?;
        let mut p1 = Self::proxy(&ns_s)?;
        let mut p2 = Self::proxy(&ns_s)?;
        p1.set_addr("namesrv", ns);
        p2.set_addr("namesrv", ns);
        b.set_addr("namesrv", ns);
        Ok(Cluster { a, b, p1, p2 })
    }

    fn proxy(ns: &str) -> anyhow::Result<Node> {
        Node::launch(&["proxy", "--namesrv", ns], &PROXY_DOORS, &[])
    }

    /// Restarts a killed proxy (`p1` when `first`, else `p2`) on its ports.
    pub fn restart_proxy(&mut self, first: bool) -> anyhow::Result<()> {
        let ns = self.a.addr("namesrv");
        let p = if first { &mut self.p1 } else { &mut self.p2 };
        p.restart()?;
        p.set_addr("namesrv", ns);
        Ok(())
    }

    /// Creates `topic` (`queues` per group) through proxy 1 and waits until both
    /// groups have it and both proxies route to both.
    pub async fn topic(&self, topic: &str, queues: u32) -> anyhow::Result<()> {
        create_topic(&self.p1, topic, queues).await?;
        for node in [&self.a, &self.b] {
            let (status, text) =
                curl(&[&format!("http://{}/v1/topics/{topic}", node.addr("http"))])?;
            if status != 200 {
                bail!("topic {topic} is not on a broker group: {status} {text}");
            }
        }
        for p in [&self.p1, &self.p2] {
            wait_for(
                "the proxies route the topic over both groups",
                Duration::from_secs(10),
                || {
                    let (status, text) =
                        curl(&[&format!("http://{}/v1/topics/{topic}", p.addr("http"))]).ok()?;
                    let v: Value = serde_json::from_str(&text).ok()?;
                    (status == 200 && v["write_queues"].as_u64() == Some(u64::from(2 * queues)))
                        .then_some(())
                },
            )?;
        }
        Ok(())
    }
}

/// Messages stored on one broker group for `topic` (its queues' max - min).
pub fn stored_on(node: &Node, topic: &str) -> anyhow::Result<u64> {
    let (status, text) = curl(&[&format!(
        "http://{}/v1/topics/{topic}/status",
        node.addr("http")
    )])?;
    if status != 200 {
        bail!("topic status: {status} {text}");
    }
    let v: Value = serde_json::from_str(&text)?;
    v["messages"].as_u64().context("no message count")
}
