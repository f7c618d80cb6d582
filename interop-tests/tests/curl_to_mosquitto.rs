//! The HTTP issue's cross-protocol promise, as a user would type it: a message
//! `curl`-published to topic `sensors` with `tag=room1/temp` reaches a
//! `mosquitto_sub -t 'sensors/+/temp'` subscriber, and one with another tag does not.

use std::time::Duration;

use interop_tests::Node;
use interop_tests::doors::{self, Door, MqttSub, Outgoing};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_publish_reaches_a_mosquitto_wildcard_subscriber() {
    let node = Node::start().expect("start");
    doors::create_topic(&node, "sensors", 4).await.unwrap();
    let mut sub = MqttSub::start_filter(&node, "sensors", "sensors/+/temp").unwrap();

    let mut other = Outgoing::sample("sensors");
    other.tag = "room1/humidity".into();
    other.body = b"not for this filter".to_vec();
    Door::Http.publish(&node, &other).await.unwrap();
    let mut wanted = Outgoing::sample("sensors");
    wanted.body = b"21.5".to_vec();
    Door::Http.publish(&node, &wanted).await.unwrap();

    let got = sub.next(Duration::from_secs(30)).unwrap();
    assert_eq!(got.tag.as_deref(), Some("room1/temp"));
    assert_eq!(got.body, b"21.5");
    assert_eq!(got.properties.get("color").map(String::as_str), Some("red"));
}
