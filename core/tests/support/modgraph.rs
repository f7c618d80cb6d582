//! Module import loops inside one crate, found from its source alone: the same
//! analysis as `/work/shared/tools/modloops.py`, in Rust so a crate's tests can
//! keep its module graph a tree of layers without python.
//!
//! A file's module is its path under `src/` (`mod.rs`, `lib.rs`, `main.rs` name
//! their directory), cut to `level` components; it points at every module it
//! names as `crate::a::b` or `super::x` (comments and docs included: an intra-doc
//! link is a dependency of the reader too). A `#[cfg(test)] mod tests` block and
//! everything after it, and files named `tests.rs`, are left out: tests may
//! reach anywhere. A loop is a strongly connected set of two or more modules.
//!
//! Any crate's tests can use it:
//!
//! ```ignore
//! #[path = "../../core/tests/support/modgraph.rs"]
//! mod modgraph;
//!
//! #[test]
//! fn no_module_loops() {
//!     let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
//!     modgraph::assert_no_loops(&src, 2);
//! }
//! ```

#![allow(dead_code)] // each includer uses what it needs

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One loop: its modules (sorted) and the edges between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loop {
    pub modules: Vec<String>,
    pub edges: Vec<(String, String)>,
}

/// Panics, listing every loop and its edges, if the crate under `src` has a
/// module loop at `level`.
pub fn assert_no_loops(src: &Path, level: usize) {
    let found = loops(src, level);
    if found.is_empty() {
        return;
    }
    let mut msg = format!("module loops in {} at level {level}:\n", src.display());
    for l in &found {
        msg += &format!("  {:?}\n", l.modules);
        for (a, b) in &l.edges {
            msg += &format!("    {a} -> {b}\n");
        }
    }
    panic!("{msg}");
}

/// Every module loop of the crate whose source directory is `src`, at `level`
/// path components (1: `broker`, 2: `broker::api`).
pub fn loops(src: &Path, level: usize) -> Vec<Loop> {
    let mut files = Vec::new();
    collect(src, src, &mut files);
    let edges = graph(&files, level);
    strongly_connected(&edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|mut modules| {
            modules.sort();
            let mut between = Vec::new();
            for a in &modules {
                for b in edges.get(a).into_iter().flatten() {
                    if modules.contains(b) {
                        between.push((a.clone(), b.clone()));
                    }
                }
            }
            Loop {
                modules,
                edges: between,
            }
        })
        .collect()
}

/// `(module path, source)` of every `.rs` file below `dir`.
fn collect(root: &Path, dir: &Path, out: &mut Vec<(Vec<String>, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect(root, &path, out);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let rel = path.strip_prefix(root).unwrap_or(&path).with_extension("");
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|p| p == "mod") {
            parts.pop();
        }
        if parts == ["lib"] || parts == ["main"] {
            parts.clear();
        }
        out.push((parts, text));
    }
}

fn module_name(parts: &[String], level: usize) -> String {
    if parts.is_empty() {
        "<root>".to_owned()
    } else {
        parts[..parts.len().min(level)].join("::")
    }
}

fn graph(files: &[(Vec<String>, String)], level: usize) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (parts, text) in files {
        if parts.last().is_some_and(|p| p == "tests") {
            continue;
        }
        let text = &text[..test_module_start(text).unwrap_or(text.len())];
        let me = module_name(parts, level);
        let mut add = |target: String| {
            let related = target == me
                || me.starts_with(&format!("{target}::"))
                || target.starts_with(&format!("{me}::"));
            if !related {
                edges.entry(me.clone()).or_default().insert(target);
            }
        };
        for rest in after_word(text, "crate::") {
            let Some((first, rest)) = ident(rest) else {
                continue;
            };
            let mut target = vec![first.to_owned()];
            if level > 1
                && let Some(second) = rest.strip_prefix("::").and_then(ident)
            {
                target.push(second.0.to_owned());
            }
            add(module_name(&target, level));
        }
        for rest in after_word(text, "super::") {
            let Some((name, _)) = ident(rest) else {
                continue;
            };
            let mut target = parts[..parts.len().saturating_sub(1)].to_vec();
            target.push(name.to_owned());
            add(module_name(&target, level));
        }
    }
    edges
}

/// Where a `#[cfg(test)]` line followed (across a line break) by `mod tests` starts.
fn test_module_start(text: &str) -> Option<usize> {
    let mut line_start = 0;
    for line in text.split_inclusive('\n') {
        if let Some(after) = line.strip_prefix("#[cfg(test)]") {
            let rest = &text[line_start + line.len() - after.len()..];
            let trimmed = rest.trim_start();
            let gap = &rest[..rest.len() - trimmed.len()];
            if gap.contains('\n') && trimmed.starts_with("mod tests") {
                return Some(line_start);
            }
        }
        line_start += line.len();
    }
    None
}

/// The text after each occurrence of `word` that does not continue an identifier.
fn after_word<'a>(text: &'a str, word: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    text.match_indices(word).filter_map(move |(at, _)| {
        let before = text[..at].chars().next_back();
        let joined = before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        (!joined).then(|| &text[at + word.len()..])
    })
}

/// A module-like identifier (`[a-z_][a-z0-9_]*`) at the start of `s`, and the rest.
fn ident(s: &str) -> Option<(&str, &str)> {
    let first = s.chars().next()?;
    if !(first.is_ascii_lowercase() || first == '_') {
        return None;
    }
    let end = s
        .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
        .unwrap_or(s.len());
    Some((&s[..end], &s[end..]))
}

/// Tarjan's strongly connected components.
fn strongly_connected(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.edges.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            s.out.push(component);
        }
    }
    let mut nodes: BTreeSet<&str> = edges.keys().map(String::as_str).collect();
    nodes.extend(edges.values().flatten().map(String::as_str));
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in nodes {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}
