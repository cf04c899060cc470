//! The host's shape: its modules depend on each other in one direction only, and `lib.rs`, the
//! map, names every one of them.
//!
//! A module `a` depends on `b` when any file under `a` names `crate::b` in code (comments and
//! doc links do not count). A cycle means two modules can only be understood, tested or
//! changed together; this test names the cycle so it is cut where it appears.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`runtime/http.rs` -> `runtime`); `None` for the
/// crate root and the binary.
fn module_of(file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src()).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
    (name != "lib" && name != "main").then_some(name)
}

/// The code of a file without its comments.
fn code(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules named in `code` as `crate::name` or inside `use crate::{..}`.
fn named_modules(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Only the first segment of each path in the group is a module of the crate.
            let mut depth = 0;
            let mut start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        out.insert(ident(&group[i..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out.retain(|m| !m.is_empty());
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let Some(module) = module_of(&file) else {
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        let deps = edges.entry(module.clone()).or_default();
        for dep in named_modules(&code(&text)) {
            if dep != module {
                deps.insert(dep);
            }
        }
    }
    edges
}

/// A cycle through `node`, if there is one reachable from it, as the list of modules on it.
fn find_cycle(
    node: &str,
    edges: &BTreeMap<String, BTreeSet<String>>,
    path: &mut Vec<String>,
    done: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    if let Some(at) = path.iter().position(|m| m == node) {
        let mut cycle = path[at..].to_vec();
        cycle.push(node.to_owned());
        return Some(cycle);
    }
    if done.contains(node) {
        return None;
    }
    path.push(node.to_owned());
    for next in edges.get(node).into_iter().flatten() {
        if let Some(cycle) = find_cycle(next, edges, path, done) {
            return Some(cycle);
        }
    }
    path.pop();
    done.insert(node.to_owned());
    None
}

#[test]
fn the_module_graph_has_no_cycle() {
    let edges = graph();
    assert!(
        edges.len() > 10,
        "the host's modules were not found: {edges:?}"
    );
    let mut done = BTreeSet::new();
    for module in edges.keys() {
        if let Some(cycle) = find_cycle(module, &edges, &mut Vec::new(), &mut done) {
            panic!(
                "import cycle between the host's modules: {}",
                cycle.join(" -> ")
            );
        }
    }
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let mut edges = BTreeMap::new();
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")] {
        edges
            .entry(from.to_owned())
            .or_insert_with(BTreeSet::new)
            .insert(to.to_owned());
    }
    let cycle = find_cycle("d", &edges, &mut Vec::new(), &mut BTreeSet::new()).unwrap();
    assert_eq!(cycle, ["a", "b", "c", "a"]);
    assert_eq!(
        named_modules("use crate::{config::{A, B}, keys, runtime::x};\nlet _ = crate::metrics::M;"),
        BTreeSet::from(["config", "keys", "metrics", "runtime"].map(String::from))
    );
}

#[test]
fn lib_rs_names_every_module_in_its_map() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let map: String = lib
        .lines()
        .filter(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut missing = Vec::new();
    for module in graph().keys() {
        if !map.contains(&format!("[`{module}`]")) {
            missing.push(module.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "lib.rs's module doc does not place these modules on the data's way: {missing:?}"
    );
}
