//! The OpenAPI document against the router: every documented operation is served,
//! every served route is documented (routes come only from the table in
//! `src/routes.rs`, and every entry there documents its answers), and every
//! `$ref` resolves. The check of live answers against the document's schemas is
//! `interop-tests/tests/schemathesis.rs`.

mod support;

use std::collections::BTreeSet;

use bytes::Bytes;
use rocketgate_core::broker::Broker;
use serde_json::Value;
use support::*;

const METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE"];

/// A concrete path for a template: names that exist nowhere, so nothing is changed.
fn concrete(template: &str) -> String {
    template
        .split('/')
        .map(|seg| match seg {
            "{queue}" => "0",
            s if s.starts_with('{') => "openapi-none",
            s => s,
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_operation_is_served_and_no_other_method() {
    let node = start().await;
    let a = node.addr;
    let r = get(a, "/v1/openapi.json").await;
    assert_eq!(r.status, 200);
    let doc = r.json();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 30, "{} paths", paths.len());
    for (template, item) in paths {
        let documented: BTreeSet<String> = item
            .as_object()
            .unwrap()
            .keys()
            .map(|m| m.to_ascii_uppercase())
            .collect();
        let path = concrete(template);
        for method in METHODS {
            // A JSON body that is wrong for every endpoint: answered by the handler
            // (400) when routed, by the router (404/405) when not.
            let resp = call(
                a,
                method,
                &path,
                &[("content-type", "application/json")],
                Bytes::from_static(b"[]"),
            )
            .await;
            let code = serde_json::from_slice::<Value>(&resp.body)
                .ok()
                .and_then(|v| v["error"]["code"].as_str().map(str::to_owned));
            let unrouted = matches!(code.as_deref(), Some("no_route" | "method_not_allowed"));
            if documented.contains(*method) {
                assert!(
                    !unrouted,
                    "{method} {template} is in /v1/openapi.json but not served: {} {code:?}",
                    resp.status
                );
            } else {
                assert_eq!(
                    (resp.status, code.as_deref()),
                    (405, Some("method_not_allowed")),
                    "{method} {template} is served but not in /v1/openapi.json"
                );
            }
        }
    }
    node.stop().await;
}

/// Every entry of the table documents at least one answer, its body if it takes
/// JSON, and every `$ref` of the document names a schema of `components`.
#[test]
fn every_endpoint_documents_its_answers_and_every_ref_resolves() {
    for e in rocketgate_http::routes::endpoints::<Broker>() {
        assert!(
            !e.answers.is_empty(),
            "{} {}: document what it answers: .answers::<T>(status, …) (docs/http.md, \"The OpenAPI document\")",
            e.method,
            e.path
        );
    }
    let doc = rocketgate_http::routes::openapi_document::<Broker>();
    // A JSON answer names its struct (a `$ref`), never a bare object from `json!`;
    // the document itself is the one exception.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for (status, answer) in op["responses"].as_object().unwrap() {
                let Some(schema) = answer.pointer("/content/application~1json/schema") else {
                    continue;
                };
                assert!(
                    schema.get("$ref").is_some() || path == "/v1/openapi.json",
                    "{method} {path} {status}: a JSON answer without a named schema: {schema}"
                );
            }
        }
    }
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert!(!refs.is_empty());
    for r in refs {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("unexpected $ref {r}"));
        assert!(schemas.contains_key(name), "$ref {r} names no schema");
    }
    // The error envelope lists every code the door answers.
    let codes = &schemas["ErrorDetail"]["properties"]["code"]["enum"];
    for code in [
        "bad_request",
        "topic_not_found",
        "stale_receipt_handle",
        "overloaded",
    ] {
        assert!(
            codes.as_array().unwrap().iter().any(|c| c == code),
            "{code}"
        );
    }
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                out.push(r.clone());
            }
            m.values().for_each(|v| collect_refs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

/// Routes come only from the table: a route added with `Router::route` (or a
/// nested or merged router) anywhere else in the crate would be served without
/// being documented.
#[test]
fn routes_are_added_only_from_the_table() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    let mut dirs = vec![src];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for needle in [
                ".route(",
                ".route_service(",
                ".nest(",
                ".nest_service(",
                ".merge(",
            ] {
                for _ in text.matches(needle) {
                    found.push(format!(
                        "{}: {needle}",
                        path.file_name().unwrap().to_string_lossy()
                    ));
                }
            }
        }
    }
    assert_eq!(
        found,
        ["routes.rs: .route("],
        "add routes as entries of `endpoints()` in src/routes.rs, which documents them \
         (docs/http.md, \"The OpenAPI document\")"
    );
}
