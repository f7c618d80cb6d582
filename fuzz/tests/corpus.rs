//! Replays every stored fuzz input (`fuzz/corpus/<target>/*`, which keeps the seeds,
//! what the long runs found worth keeping, and every crash input once fixed) through
//! its target: a regression test for each. Runs the built-in seeds too, so a corpus
//! directory that went missing does not make this pass on nothing.

use std::path::Path;

use rocketgate_fuzz::{TARGETS, seeds};

fn target(name: &str) -> fn(&[u8]) {
    TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
        .unwrap_or_else(|| panic!("no fuzz target {name}"))
}

#[test]
fn every_target_has_a_stored_corpus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (name, _) in TARGETS {
        let n = std::fs::read_dir(root.join(name))
            .map(|d| d.count())
            .unwrap_or(0);
        assert!(n > 0, "fuzz/corpus/{name} is empty or missing");
    }
}

#[test]
fn built_in_seeds_pass() {
    for (name, inputs) in seeds::all() {
        let run = target(name);
        for input in inputs {
            run(&input);
        }
    }
}

/// One test per target, so a failure names its target and input file.
macro_rules! replay {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(stringify!($name));
            let run = target(stringify!($name));
            let mut files: Vec<_> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .map(|e| e.expect("dir entry").path())
                .collect();
            files.sort();
            for f in &files {
                let input = std::fs::read(f).expect("read corpus file");
                eprintln!("{}", f.display());
                run(&input);
            }
            assert!(!files.is_empty());
        }
    )*};
}

replay!(
    remoting_decode,
    auth,
    mqtt_codec,
    mqtt_session,
    ws_json,
    http_json,
    sql92,
    record,
    recovery,
);

#[test]
fn every_target_is_replayed() {
    // The macro's list and TARGETS must name the same targets.
    let listed = [
        "remoting_decode",
        "auth",
        "mqtt_codec",
        "mqtt_session",
        "ws_json",
        "http_json",
        "sql92",
        "record",
        "recovery",
    ];
    let names: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, listed);
}
