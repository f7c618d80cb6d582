//! `rocketgate admin topic create|update|delete --brokers a,b | --cluster NAME`
//! against two broker groups (`broker-a`: a standalone node with the NameServer;
//! `broker-b`: `rocketgate broker`): each group's master is changed through the
//! NameServer's view, one result row per group, and a non-zero exit when any failed
//! (docs/operations.md, "Topics on several broker groups").

use std::process::{Command, Output};
use std::time::Duration;

use interop_tests::cluster::BROKER_DOORS;
use interop_tests::doors::curl;
use interop_tests::{Node, binary, wait_for};
use serde_json::Value;

fn admin(node: &Node, args: &[&str]) -> Output {
    Command::new(binary().expect("the rocketgate binary"))
        .arg("admin")
        .args(["--server", &format!("http://{}", node.addr("http"))])
        .args(args)
        .output()
        .expect("running rocketgate admin")
}

fn topic_on(node: &Node, topic: &str) -> (u16, Value) {
    let (status, text) =
        curl(&[&format!("http://{}/v1/topics/{topic}", node.addr("http"))]).expect("curl");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_is_created_changed_and_deleted_on_several_broker_groups() {
    let a = Node::start().expect("broker-a");
    let ns = a.addr("namesrv").to_string();
    let b = Node::launch(
        &["broker", "--namesrv", &ns, "--name", "broker-b"],
        &BROKER_DOORS,
        &[],
    )
    .expect("broker-b");
    tokio::task::block_in_place(|| {
        let url = format!("http://{}/v1/cluster", a.addr("http"));
        let view: Value = wait_for(
            "both broker groups in the NameServer's view",
            Duration::from_secs(60),
            || {
                let (status, text) = curl(&[&url]).ok()?;
                let v: Value = serde_json::from_str(&text).ok()?;
                (status == 200 && v["brokers"].as_array()?.len() == 2).then_some(v)
            },
        )
        .expect("cluster view");
        let names: Vec<String> = view["brokers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["broker_name"].as_str().unwrap().to_owned())
            .collect();
        let a_name = names.iter().find(|n| *n != "broker-b").unwrap().clone();
        let cluster = view["brokers"][0]["cluster"].as_str().unwrap().to_owned();
        let both = format!("{a_name},broker-b");

        // Create on both, by name: a table with one ok row per group.
        let out = admin(
            &a,
            &[
                "topic",
                "create",
                "fan",
                "--queues",
                "3",
                "--brokers",
                &both,
            ],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        let table = stdout(&out);
        assert_eq!(table.matches(" ok ").count(), 2, "{table}");
        for node in [&a, &b] {
            let (status, t) = topic_on(node, "fan");
            assert_eq!(status, 200, "{t}");
            assert_eq!(t["read_queues"], 3, "{t}");
        }

        // Update on the whole cluster: each group keeps what is not named.
        let out = admin(
            &a,
            &[
                "--json",
                "topic",
                "update",
                "fan",
                "--write-queues",
                "2",
                "--cluster",
                &cluster,
            ],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["failed"], 0, "{v}");
        assert_eq!(v["results"].as_array().unwrap().len(), 2, "{v}");
        for node in [&a, &b] {
            let (_, t) = topic_on(node, "fan");
            assert_eq!(
                (t["read_queues"].as_u64(), t["write_queues"].as_u64()),
                (Some(3), Some(2)),
                "{t}"
            );
        }

        // Created again: refused on both, reported per group, exit 1.
        let out = admin(
            &a,
            &["--json", "topic", "create", "fan", "--brokers", &both],
        );
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["failed"], 2, "{v}");
        assert!(
            v["results"][0]["error"]
                .as_str()
                .unwrap()
                .contains("exists"),
            "{v}"
        );

        // One unknown group: the known one is done, the unknown one fails, exit 1.
        let out = admin(
            &a,
            &[
                "topic",
                "create",
                "solo",
                "--brokers",
                &format!("{a_name},nope"),
            ],
        );
        assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
        let table = stdout(&out);
        assert!(table.contains("no broker group \"nope\""), "{table}");
        assert_eq!(topic_on(&a, "solo").0, 200);
        assert_eq!(topic_on(&b, "solo").0, 404);

        // An unknown cluster: not found (2), nothing done.
        let out = admin(
            &a,
            &["topic", "delete", "fan", "--cluster", "no-such-cluster"],
        );
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains("no-such-cluster"), "{}", stderr(&out));

        // Deleted on the cluster: gone from both.
        let out = admin(&a, &["topic", "delete", "fan", "--cluster", &cluster]);
        assert!(out.status.success(), "{}", stderr(&out));
        for node in [&a, &b] {
            assert_eq!(topic_on(node, "fan").0, 404);
        }
        // Bad arguments: both target flags.
        let out = admin(
            &a,
            &[
                "topic",
                "delete",
                "fan",
                "--cluster",
                &cluster,
                "--brokers",
                &both,
            ],
        );
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    });
}
