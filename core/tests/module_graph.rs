//! Keeps core's module graph free of loops (issue #24): the layers are
//! clock/sync/error at the bottom, then the store, then the broker, whose
//! values sit below the `MessagingApi` trait and the local `Broker`, and whose
//! delayed delivery and transactions reach the broker only through narrow seams.

#[path = "support/modgraph.rs"]
mod modgraph;

use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn core_has_no_module_loop_at_the_top_level() {
    modgraph::assert_no_loops(&src(), 1);
}

#[test]
fn core_has_no_module_loop_one_level_down() {
    modgraph::assert_no_loops(&src(), 2);
}

#[test]
fn the_broker_has_no_module_loop() {
    modgraph::assert_no_loops(&src().join("broker"), 1);
    modgraph::assert_no_loops(&src().join("store"), 1);
}

/// The analysis sees loops through `crate::` and `super::` paths, skips test
/// modules, and names the edges of what it found.
#[test]
fn the_analysis_finds_a_loop_and_ignores_tests() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("b")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::b::c::Thing;\n").unwrap();
    std::fs::write(src.join("b/mod.rs"), "pub mod c;\npub mod d;\n").unwrap();
    std::fs::write(src.join("b/c.rs"), "use super::d;\n").unwrap();
    std::fs::write(
        src.join("b/d.rs"),
        "/// See [`crate::a`].\npub struct D;\n\n#[cfg(test)]\nmod tests {\n    use crate::b::c;\n}\n",
    )
    .unwrap();

    // Level 1: a -> b (through b::c) and b -> a (b::d's doc link).
    let found = modgraph::loops(src, 1);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].modules, ["a", "b"]);
    assert_eq!(
        found[0].edges,
        [("a".into(), "b".into()), ("b".into(), "a".into())]
    );
    // Level 2: a -> b::c -> b::d -> a; d's test module naming c is no edge.
    let found = modgraph::loops(src, 2);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].modules, ["a", "b::c", "b::d"]);

    // Without the doc link there is no loop at either level.
    std::fs::write(src.join("b/d.rs"), "pub struct D;\n").unwrap();
    assert!(modgraph::loops(src, 1).is_empty());
    assert!(modgraph::loops(src, 2).is_empty());
}
