//! Prints the HTTP door's OpenAPI document without a running node:
//! `cargo run -p rocketgate-http --example openapi > openapi.json`.

use rocketgate_core::broker::Broker;

fn main() {
    let doc = rocketgate_http::routes::openapi_document::<Broker>();
    println!(
        "{}",
        serde_json::to_string_pretty(&doc).expect("the document is JSON")
    );
}
