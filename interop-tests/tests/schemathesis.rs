//! The HTTP door against its own OpenAPI document, checked by Schemathesis (a
//! property-based API tester nobody on this project wrote): it reads
//! `/v1/openapi.json` from a running `rocketgate standalone`, generates requests
//! from the schemas (valid ones, and invalid ones that must be refused), and checks
//! every answer: no 5xx, the status is documented, the content type and body match
//! the documented schema, and input the schema forbids gets a 4xx.
//!
//! Deterministic and short: a fixed seed, a few examples per operation, one worker,
//! no example database. Schemathesis is installed (pinned) by
//! `scripts/install-test-deps`; without it this test fails with that hint.
//!
//! Excluded: `GET /v1/groups/{group}/topics/{topic}/stream` (Server-Sent Events). A
//! stream that is working never ends, so every valid request to it would be a
//! request timeout for Schemathesis; its answers are checked in
//! `gateways/http/tests/stream_replay.rs` and its error answers (before the stream
//! starts) are the same code as the receive's, which is checked here.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use interop_tests::Node;

/// The Schemathesis version `scripts/install-test-deps` installs.
const VERSION: &str = "4.32.5";

/// The longest a run may take before the test kills it (a hang is a failure).
const LIMIT: Duration = Duration::from_secs(240);

/// The checks: everything about the answers, and that bad input is refused.
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
                      response_headers_conformance,response_schema_conformance,\
                      negative_data_rejection";

fn st_version() -> Option<String> {
    let out = Command::new("st").arg("--version").output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[test]
fn the_http_door_conforms_to_its_openapi_document() {
    let version = st_version().unwrap_or_else(|| {
        panic!("Schemathesis (`st`) is not installed: run scripts/install-test-deps")
    });
    assert!(
        version.contains(VERSION),
        "Schemathesis {VERSION} is expected, found {version:?}: run scripts/install-test-deps"
    );
    // Long polls capped at 200 ms: generated `wait_ms` values are honoured up to
    // `http.max_wait`, and the run should not spend its time waiting.
    let node = Node::start_with_env(&[("ROCKETGATE_HTTP__MAX_WAIT", "200ms")]).expect("start");
    let http = node.addr("http");
    let work = tempfile::tempdir().expect("temp dir");
    let started = Instant::now();
    let mut child = Command::new("st")
        .args(["run", &format!("http://{http}/v1/openapi.json")])
        .args(["--checks", CHECKS])
        .args(["--seed", "20261203", "--max-examples", "12"])
        .args(["--workers", "1", "--generation-database", "none"])
        .args(["--exclude-path-regex", "/stream$"])
        .args(["--request-timeout", "10", "--no-color"])
        .current_dir(work.path())
        .env("SCHEMATHESIS_TELEMETRY", "false")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run st");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        let mut e = String::new();
        let _ = err.read_to_string(&mut e);
        s + &e
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for st") {
            break Some(status);
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let report = reader.join().unwrap_or_default();
    let status = status.unwrap_or_else(|| panic!("schemathesis ran over {LIMIT:?}:\n{report}"));
    assert!(
        status.success(),
        "schemathesis found mismatches ({status}):\n{report}\nnode log:\n{}",
        node.log_tail()
    );
    // A run that tested nothing would pass too: every operation but the stream
    // must have been selected and tested (Schemathesis leaves the document's own
    // path out of its total).
    let number_after = |label: &str| -> Option<(u32, Option<u32>)> {
        let rest = report.split(label).nth(1)?.split_whitespace().next()?;
        let mut parts = rest.split('/').map(|n| n.parse::<u32>().ok());
        Some((parts.next()??, parts.next().flatten()))
    };
    let (selected, total) = number_after("Selected:").expect("a `Selected:` line");
    let (tested, _) = number_after("Tested:").expect("a `Tested:` line");
    assert_eq!(
        Some(selected + 1),
        total,
        "only the stream is excluded:\n{report}"
    );
    assert_eq!(
        tested, selected,
        "every selected operation was tested:\n{report}"
    );
    assert!(selected >= 30, "{report}");
    println!("{report}");
    println!("schemathesis took {:?}", started.elapsed());
}
