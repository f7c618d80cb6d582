//! The layering ARCHITECTURE.md draws, checked so it stays true:
//!
//! - crates depend on each other only downwards: base -> config -> core -> remoting ->
//!   doors -> binary (namesrv uses remoting, never core; a door never imports another
//!   door; the bench, testkit and interop-tests crates sit beside the binary);
//! - inside a crate, modules do not import each other in a loop (a loop means two
//!   modules are one part in two files, and neither can be read, tested or replaced
//!   alone). Checked at the top level of each crate and one level down, the same
//!   analysis as `shared/tools/modloops.py`: `crate::a::b` paths in non-test code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every workspace crate: (package name, directory).
fn crates() -> Vec<(String, PathBuf)> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let members = manifest
        .split("members = [")
        .nth(1)
        .and_then(|s| s.split(']').next())
        .expect("a members list in Cargo.toml");
    let mut out = vec![("rocketgate".to_owned(), root())];
    for dir in members.split(',').map(|m| m.trim().trim_matches('"')) {
        if dir.is_empty() {
            continue;
        }
        let path = root().join(dir);
        let text = std::fs::read_to_string(path.join("Cargo.toml")).unwrap();
        let name = text
            .lines()
            .find_map(|l| l.strip_prefix("name = "))
            .map(|n| n.trim().trim_matches('"').to_owned())
            .unwrap_or_else(|| panic!("{dir}/Cargo.toml has no name"));
        out.push((name, path));
    }
    out
}

/// The workspace crates a crate depends on (normal dependencies, not dev ones).
fn internal_deps(dir: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let mut section = String::new();
    let mut deps = BTreeSet::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_owned();
        } else if section == "[dependencies]"
            && let Some(name) = line.split(['=', '.', ' ']).next()
            && name.starts_with("rocketgate-")
        {
            deps.insert(name.to_owned());
        }
    }
    deps
}

#[test]
fn crates_depend_only_downwards() {
    // What each library crate may depend on. The binary and the bench crate wire
    // everything together and may use any of them.
    let allowed: BTreeMap<&str, &[&str]> = BTreeMap::from([
        ("rocketgate-base", &[][..]),
        ("rocketgate-config", &["rocketgate-base"][..]),
        (
            "rocketgate-core",
            &["rocketgate-base", "rocketgate-config"][..],
        ),
        (
            "rocketgate-remoting",
            &["rocketgate-base", "rocketgate-config"][..],
        ),
        // Security (layer 2): users, the ACL engine, request signatures; used by every
        // door and by the NameServer's check of internal writes.
        (
            "rocketgate-auth",
            &["rocketgate-base", "rocketgate-config"][..],
        ),
        // The NameServer and every door check credentials and the ACL (rocketgate-auth).
        (
            "rocketgate-tls",
            &["rocketgate-base", "rocketgate-config"][..],
        ),
        // Layer 3 beside the NameServer: the Raft controller of automatic failover. It
        // decides who is master; it never touches storage or a door.
        // Both serve TLS on their port (`tls.controller`, `tls.namesrv`) and the
        // controller reaches its peers over it (rocketgate-tls).
        (
            "rocketgate-controller",
            &[
                "rocketgate-base",
                "rocketgate-config",
                "rocketgate-remoting",
                "rocketgate-tls",
            ][..],
        ),
        (
            "rocketgate-namesrv",
            &[
                "rocketgate-auth",
                "rocketgate-base",
                "rocketgate-config",
                "rocketgate-remoting",
                "rocketgate-tls",
            ][..],
        ),
        (
            "rocketgate-native",
            &[
                "rocketgate-auth",
                "rocketgate-base",
                "rocketgate-config",
                "rocketgate-core",
                "rocketgate-remoting",
                "rocketgate-tls",
            ][..],
        ),
        (
            "rocketgate-mqtt",
            &[
                "rocketgate-base",
                "rocketgate-config",
                "rocketgate-core",
                "rocketgate-tls",
                "rocketgate-auth",
            ][..],
        ),
        (
            "rocketgate-http",
            &[
                "rocketgate-auth",
                "rocketgate-base",
                "rocketgate-config",
                "rocketgate-core",
                "rocketgate-remoting",
                "rocketgate-tls",
            ][..],
        ),
        (
            "rocketgate-websocket",
            &[
                "rocketgate-base",
                "rocketgate-config",
                "rocketgate-core",
                "rocketgate-tls",
                "rocketgate-auth",
            ][..],
        ),
    ]);
    let mut wrong = Vec::new();
    for (name, dir) in crates() {
        let Some(ok) = allowed.get(name.as_str()) else {
            continue;
        };
        for dep in internal_deps(&dir) {
            if !ok.contains(&dep.as_str()) {
                wrong.push(format!("{name} -> {dep}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "dependencies against the layering in ARCHITECTURE.md: {wrong:?}"
    );
}

/// A crate's modules: each `.rs` file under `src` as its module path
/// (`store/commit_log/segment.rs` = `["store", "commit_log", "segment"]`).
fn modules(src: &Path) -> Vec<(PathBuf, Vec<String>)> {
    fn walk(dir: &Path, src: &Path, out: &mut Vec<(PathBuf, Vec<String>)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        entries.sort_by_key(|e| e.path());
        for e in entries {
            let p = e.path();
            if p.is_dir() {
                walk(&p, src, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(src).unwrap().with_extension("");
                let mut parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if parts.last().is_some_and(|l| l == "mod") {
                    parts.pop();
                }
                if parts == ["lib"] || parts == ["main"] {
                    parts.clear();
                }
                out.push((p, parts));
            }
        }
    }
    let mut out = Vec::new();
    walk(src, src, &mut out);
    out
}

/// The module paths a file's non-test code names, from the crate root: `crate::a::b`
/// as `a::b`, and `super::c` resolved against `parent` (the module `super` is).
fn named_paths(text: &str, parent: &[String]) -> Vec<Vec<String>> {
    // Unit tests may reach anywhere; they are cut like modloops.py cuts them.
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = paths_after(code, "crate::");
    out.extend(paths_after(code, "super::").into_iter().map(|p| {
        let mut full = parent.to_vec();
        full.extend(p);
        full
    }));
    out
}

/// The paths that follow each `prefix` (`crate::` or `super::`) in `code`.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices(prefix) {
        if i > 0 {
            let before = code.as_bytes()[i - 1];
            if before.is_ascii_alphanumeric() || before == b'_' || before == b'$' {
                continue; // `$crate::`, `rocketgate_crate::`
            }
            if before == b':' {
                continue; // `super::super::x`: counted from the first `super::`
            }
        }
        let rest = &code[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::X, b};`: each item of the group is a path of its own.
            let group = &group[..group.find(';').unwrap_or(group.len())];
            for item in group.split(',') {
                let item = item.trim().trim_start_matches('{');
                out.extend(module_path(item));
            }
        } else {
            out.extend(module_path(rest));
        }
    }
    out
}

/// The leading lower-case segments (at most two) of a path: `a::b::Item` is `a::b`.
fn module_path(text: &str) -> Option<Vec<String>> {
    let mut path = Vec::new();
    for seg in text.split("::") {
        let ident: String = seg
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let whole = ident.len() == seg.len();
        if ident.is_empty() || !ident.starts_with(|c: char| c.is_ascii_lowercase()) {
            break;
        }
        path.push(ident);
        if !whole || path.len() == 2 {
            break;
        }
    }
    (!path.is_empty()).then_some(path)
}

/// Loops (strongly connected components of two or more modules) among a crate's
/// modules grouped to `level` path components.
fn loops(src: &Path, level: usize) -> Vec<Vec<String>> {
    strongly_connected(&graph(src, level))
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect()
}

/// Which module names which, for a crate's modules grouped to `level` components.
fn graph(src: &Path, level: usize) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(src);
    let known: BTreeSet<Vec<String>> = mods.iter().map(|(_, p)| p.clone()).collect();
    let group = |parts: &[String]| parts[..parts.len().min(level)].join("::");
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, parts) in &mods {
        if parts.last().is_some_and(|l| l == "tests") {
            continue;
        }
        let me = if parts.is_empty() {
            "<root>".to_owned()
        } else {
            group(parts)
        };
        let text = std::fs::read_to_string(file).unwrap();
        // `super` of `a/b.rs` (module a::b) is `a`; of `a/mod.rs` (module a) the root.
        let parent = &parts[..parts.len().saturating_sub(1)];
        for mut target in named_paths(&text, parent) {
            // Only the part of the path that names modules (`crate::a::Item` is `a`).
            while target.len() > 1 && !known.contains(&target) {
                target.pop();
            }
            let t = group(&target);
            let nested = me.starts_with(&format!("{t}::")) || t.starts_with(&format!("{me}::"));
            if t != me && !nested {
                edges.entry(me.clone()).or_default().insert(t);
            }
        }
    }
    edges
}

/// Tarjan's algorithm over a small graph.
fn strongly_connected(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let lw = self.low[w.as_str()];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w.as_str()) {
                    let iw = self.index[w.as_str()];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                component.sort();
                self.out.push(component);
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    let mut nodes: BTreeSet<&str> = edges.keys().map(String::as_str).collect();
    nodes.extend(edges.values().flatten().map(String::as_str));
    for v in nodes {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.out
}

#[test]
fn no_crate_has_a_module_loop() {
    let mut found = Vec::new();
    for (name, dir) in crates() {
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        for level in [1, 2] {
            let edges = graph(&src, level);
            for component in loops(&src, level) {
                found.push(format!("{name} (level {level}): {component:?}"));
                for a in &component {
                    for b in edges[a].iter().filter(|b| component.contains(b)) {
                        found.push(format!("    {a} -> {b}"));
                    }
                }
            }
        }
    }
    assert!(found.is_empty(), "module loops:\n{}", found.join("\n"));
}

#[test]
fn the_loop_finder_finds_a_loop() {
    // The check above passing means nothing unless it can fail.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a; mod b; mod c;").unwrap();
    std::fs::write(src.join("a/mod.rs"), "use crate::b::Thing;").unwrap();
    std::fs::write(
        src.join("b.rs"),
        "pub struct Thing;\nfn f() { crate::a::g(); }\n#[cfg(test)]\nmod tests { use crate::c::X; }",
    )
    .unwrap();
    std::fs::write(src.join("c.rs"), "use crate::{b::Thing, a};").unwrap();
    assert_eq!(loops(src, 1), vec![vec!["a".to_owned(), "b".to_owned()]]);
    // c -> a and c -> b through a grouped import, but nothing comes back to c.
    // b -> c is test code only, so c is not in the loop.
    std::fs::write(src.join("b.rs"), "pub struct Thing;").unwrap();
    assert!(loops(src, 1).is_empty());
}

#[test]
fn super_paths_count_as_edges() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir(src.join("m")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod m;").unwrap();
    std::fs::write(src.join("m/mod.rs"), "mod x; mod y;").unwrap();
    std::fs::write(src.join("m/x.rs"), "use super::y::Y;").unwrap();
    std::fs::write(src.join("m/y.rs"), "use super::{x, z};").unwrap();
    assert!(loops(src, 1).is_empty());
    assert_eq!(
        loops(src, 2),
        vec![vec!["m::x".to_owned(), "m::y".to_owned()]]
    );
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

/// What opens a store over the machine's real disk (spelled in two pieces so this
/// file does not match itself).
const REAL_DISK: &str = concat!("StoreDeps::", "default()");

/// Crates that exist to test or measure: all of their code counts as test code.
const TEST_CRATES: [&str; 4] = [
    "rocketgate-bench",
    "rocketgate-fuzz",
    "interop-tests",
    "rocketgate-testkit",
];

/// The places in test code (tests, `#[cfg(test)]` modules, doc examples, test and
/// bench crates) that open a store over the machine's real disk, or start a broker
/// process without lifting the hard ratio.
fn tests_reading_the_machines_disk(name: &str, crate_dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for file in rust_files(&crate_dir.join("tests")) {
        let text = std::fs::read_to_string(&file).unwrap();
        if text.contains(REAL_DISK) {
            found.push(format!("{}: {REAL_DISK}", file.display()));
        }
        let starts_a_broker = text.contains("CARGO_BIN_EXE_rocketgate")
            && (text.contains("\"standalone\"") || text.contains("\"broker\""));
        if starts_a_broker && !text.contains("ROCKETGATE_STORE__DISK_HARD_RATIO") {
            found.push(format!(
                "{}: starts a broker with the default hard ratio",
                file.display()
            ));
        }
    }
    let all_test = TEST_CRATES.contains(&name);
    for file in rust_files(&crate_dir.join("src")) {
        let text = std::fs::read_to_string(&file).unwrap();
        let tests = if all_test {
            Some(text.as_str())
        } else {
            text.split_once("#[cfg(test)]").map(|(_, t)| t)
        };
        if tests.is_some_and(|t| t.contains(REAL_DISK)) {
            found.push(format!("{}: {REAL_DISK} in test code", file.display()));
        }
        let doc_example = text.lines().any(|l| {
            let l = l.trim_start();
            (l.starts_with("//!") || l.starts_with("///"))
                && l.contains("Store::open(")
                && l.contains(REAL_DISK)
        });
        if doc_example {
            found.push(format!("{}: {REAL_DISK} in a doc example", file.display()));
        }
    }
    found
}

/// A store refuses appends once the disk is fuller than its hard ratio (90 % by
/// default). A test over the real disk then fails on a machine whose disk another
/// job filled, which is how a CI run failed 30 tests with `DiskFull { usage_percent:
/// 90.05 }`. Test stores use `StoreDeps::fixed_usage`, test brokers a hard ratio of 1
/// (only `ENOSPC` refuses); tests/reliability.rs fills a tmpfs to test a full disk.
#[test]
fn no_test_depends_on_how_full_the_machines_disk_is() {
    let found: Vec<String> = crates()
        .iter()
        .flat_map(|(name, dir)| tests_reading_the_machines_disk(name, dir))
        .collect();
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_disk_check_finds_a_test_over_the_real_disk() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("tests")).unwrap();
    std::fs::create_dir_all(d.join("src")).unwrap();
    let open = format!("Store::open(d, s, {REAL_DISK})");
    std::fs::write(d.join("tests/a.rs"), &open).unwrap();
    std::fs::write(
        d.join("tests/b.rs"),
        "Command::new(env!(\"CARGO_BIN_EXE_rocketgate\")).arg(\"standalone\")",
    )
    .unwrap();
    // Production code may use the real disk; its tests and doc examples may not.
    std::fs::write(
        d.join("src/c.rs"),
        format!("//! {open}\nfn f() {{ {open} }}\n#[cfg(test)]\nmod t {{ {open} }}"),
    )
    .unwrap();
    assert_eq!(tests_reading_the_machines_disk("x", d).len(), 4);
    // In a bench crate every line is test code.
    std::fs::write(d.join("src/c.rs"), format!("fn f() {{ {open} }}")).unwrap();
    assert_eq!(tests_reading_the_machines_disk("x", d).len(), 2);
    assert_eq!(
        tests_reading_the_machines_disk("rocketgate-bench", d).len(),
        3
    );
}
