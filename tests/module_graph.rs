//! The operator's modules form a graph without cycles: pure planners and builders never reach
//! back into the shells that call them, and shared state never depends on a controller. A cycle
//! is how "one small change" ends up touching ten files; this keeps the layering honest.
//!
//! Module = one file of `src/` (`a/b.rs` and `a/b/mod.rs` are `a::b`). An edge is a `crate::` or
//! `super::` path in code (comments and `#[cfg(test)]` modules apart) that names another module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("reading src/") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file
        .strip_prefix(src)
        .expect("under src/")
        .with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The code of a file without comments and without its test modules.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `crate::a::b::c` and `super::x` paths, resolved to absolute segment lists.
fn paths(code: &str, here: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for start in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(i) = rest.find(start) {
            let before = rest[..i].chars().last();
            rest = &rest[i..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            let path = &rest[..end];
            rest = &rest[end..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let segs: Vec<String> = path
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            let abs = if segs[0] == "crate" {
                segs[1..].to_vec()
            } else {
                // `super` names the parent module, whether the file is `b.rs` or `b/mod.rs`.
                let mut base: Vec<String> = here[..here.len().saturating_sub(1)].to_vec();
                let mut s = &segs[..];
                while s.first().is_some_and(|x| x == "super") {
                    s = &s[1..];
                    if s.first().is_some_and(|x| x == "super") {
                        base.pop();
                    }
                }
                base.extend(s.iter().cloned());
                base
            };
            out.push(abs);
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(&src, f), f.clone()))
        .collect();
    let resolve = |path: &[String]| -> Option<Vec<String>> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|m| modules.contains_key(m))
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in &modules {
        let name = module.join("::");
        edges.entry(name.clone()).or_default();
        if name.ends_with("_tests") || name.contains("testing") || module.is_empty() {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("reading a source file");
        for path in paths(&code(&text), module) {
            let Some(target) = resolve(&path) else {
                continue;
            };
            // A module may use its own children and ancestors' items freely (a parent
            // re-exporting is not a dependency cycle in the sense that matters here).
            if target.is_empty() || target == *module || module.starts_with(&target) {
                continue;
            }
            edges
                .entry(name.clone())
                .or_default()
                .insert(target.join("::"));
        }
    }
    edges
}

/// Strongly connected components with more than one module (Tarjan).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        let edges = s.edges;
        for w in edges.get(v).into_iter().flatten() {
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
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.found
}

#[test]
fn the_module_graph_has_no_cycles() {
    let edges = graph();
    assert!(
        edges.contains_key("controllers::questdb::cloud")
            && edges["controllers::questdb::cloud"].contains("controllers::questdb::failover"),
        "the graph is read from the sources (cloud calls failover)"
    );
    let found = cycles(&edges);
    let described: Vec<String> = found
        .iter()
        .map(|c| {
            let inner: Vec<String> = c
                .iter()
                .map(|m| {
                    let to: Vec<&str> = edges[m]
                        .iter()
                        .filter(|t| c.contains(t))
                        .map(String::as_str)
                        .collect();
                    format!("{m} -> {}", to.join(", "))
                })
                .collect();
            inner.join("; ")
        })
        .collect();
    assert!(found.is_empty(), "module cycles: {described:#?}");
}

/// The planners decide; the controllers act. A planner that imports a controller's module
/// (its context, its client, its caches) is no longer a pure function of what it is given.
#[test]
fn the_planners_never_reach_into_the_controllers() {
    let edges = graph();
    assert!(
        edges.keys().any(|m| m.starts_with("plan::")),
        "the planners are read from the sources"
    );
    let reaching: Vec<String> = edges
        .iter()
        .filter(|(m, _)| m.starts_with("plan"))
        .flat_map(|(m, to)| {
            to.iter()
                .filter(|t| {
                    t.starts_with("controllers")
                        || t.starts_with("manager")
                        || t.starts_with("runtime::events")
                })
                .map(move |t| format!("{m} -> {t}"))
        })
        .collect();
    assert!(
        reaching.is_empty(),
        "planners depending on shells: {reaching:#?}"
    );
}

#[test]
fn the_checker_finds_a_cycle_when_there_is_one() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    edges.insert("a".into(), ["b".to_string()].into());
    edges.insert("b".into(), ["c".to_string()].into());
    edges.insert("c".into(), ["a".to_string()].into());
    edges.insert("d".into(), ["a".to_string()].into());
    assert_eq!(cycles(&edges), vec![vec!["a", "b", "c"]]);
}
