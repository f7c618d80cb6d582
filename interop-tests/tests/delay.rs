//! Delay through every door (issue #9): one message is published 5 seconds ahead
//! through each publishing door, each its own way (MQTT `$delayed/5/<topic>`, HTTP
//! `deliver_at`, WebSocket `delay_ms`, native delay level 2), and a consumer on
//! every consuming door — all four listening at once from before the publishes —
//! gets all four no earlier than their time: its receive wall time and the store
//! timestamp of the delivered message are both at or after publish time + 5 s.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, ensure};
use interop_tests::Node;
use interop_tests::doors::{self, Door, Got, Outgoing};
use interop_tests::now_ms;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delayed_message_from_every_door_reaches_every_door_no_earlier_than_its_time()
-> anyhow::Result<()> {
    let node = Node::start()?;
    let topic = "delayed";
    doors::create_topic(&node, topic, 2).await?;

    // Every consumer listens before anything is published, stamping each arrival.
    let mut listeners = Vec::new();
    for consumer in Door::ALL {
        let mut receiver = consumer
            .receiver(&node, topic, &format!("delay-{}", consumer.short()))
            .await
            .with_context(|| format!("opening the {consumer} consumer"))?;
        listeners.push((
            consumer,
            tokio::spawn(async move {
                let mut got: Vec<(Got, i64)> = Vec::new();
                for _ in Door::ALL {
                    let g = receiver.next(Duration::from_secs(30)).await?;
                    got.push((g, now_ms()));
                }
                receiver.close().await;
                anyhow::Ok(got)
            }),
        ));
    }

    let mut due: BTreeMap<String, (Door, i64)> = BTreeMap::new();
    for publisher in Door::ALL {
        let mut m = Outgoing::sample(topic);
        m.tag = "late".into();
        m.body = format!("delayed via {publisher}").into_bytes();
        let at = publisher
            .publish_delayed_5s(&node, &m)
            .await
            .with_context(|| format!("publishing through {publisher}"))?;
        due.insert(format!("delayed via {publisher}"), (publisher, at));
    }

    let mut rows = Vec::new();
    for (consumer, task) in listeners {
        let got = task
            .await?
            .with_context(|| format!("receiving on {consumer}"))?;
        for (g, received) in got {
            let body = String::from_utf8_lossy(&g.body).into_owned();
            let (publisher, at) = *due
                .get(&body)
                .with_context(|| format!("{consumer} got an unknown message {body:?}"))?;
            ensure!(
                received >= at,
                "{publisher} -> {consumer}: received at {received}, {} ms before its time {at}",
                at - received
            );
            if let Some(stored) = g.store_timestamp {
                ensure!(
                    stored >= at,
                    "{publisher} -> {consumer}: stored for delivery at {stored}, before {at}"
                );
            }
            ensure!(
                g.tag.as_deref() == Some("late"),
                "{publisher} -> {consumer}: tag {:?}",
                g.tag
            );
            rows.push((publisher, consumer, at, received, g.store_timestamp));
        }
    }
    ensure!(rows.len() == 16, "{} deliveries, not 16", rows.len());
    rows.sort();
    eprintln!("| publish -> consume | due (ms) | received (+ms) | store timestamp (+ms) |");
    for (p, c, at, received, stored) in rows {
        let stored = stored.map_or("-".to_string(), |s| format!("+{}", s - at));
        eprintln!("| {p} -> {c} | {at} | +{} | {stored} |", received - at);
    }
    Ok(())
}
