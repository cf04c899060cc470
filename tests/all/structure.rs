//! The host's shape: its files depend on each other in one direction only, each layer (a folder
//! under `host/src`) uses only the layers below it, and every map (`lib.rs`, each layer's
//! `mod.rs`) names what it holds.
//!
//! A file depends on a module when its code (before its `#[cfg(test)] mod` at the end; comments and
//! strings do not count) names it by a `crate::`, `super::` or `self::` path, alone or in a
//! `use` group. Each path is resolved to the longest prefix that is a file of the crate. A
//! cycle means two files can only be understood, tested or changed together; an import against
//! the layer order means a lower layer knows about a higher one. This test names either where
//! it appears, so it is cut there. A path through a root re-export (`crate::Service`) counts as
//! the module it re-exports. A parent's own `mod` children named without a prefix
//! (`use watcher::FlowWatcher;` in the parent that declares `mod watcher;`) are not edges: a
//! folder's map re-exports its files, and its files use the folder's shared types.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `lib.rs`'s root re-exports (see [`root_exports`]).
static ROOT: std::sync::LazyLock<BTreeMap<String, Module>> = std::sync::LazyLock::new(root_exports);

/// The layers, bottom up: the order `lib.rs` gives. A file may use its own layer and those
/// before it in this list, never one after it.
const LAYERS: &[&str] = &[
    "support", "config", "observe", "store", "entry", "handler", "runtime", "pipeline", "control",
    "serve", "service", "project", "cli",
];

/// A module path inside the crate (`["pipeline", "read"]`); the crate root is empty.
type Module = Vec<String>;

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

/// The module a file defines (`pipeline/read/mod.rs` and `pipeline/read.rs` are both
/// `pipeline::read`), or `None` for the binary's `main.rs`.
fn module_of(rel: &Path) -> Option<Module> {
    let mut parts: Module = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    match parts.last().map(String::as_str) {
        Some("main") if parts.len() == 1 => return None,
        Some("lib") if parts.len() == 1 => parts.clear(),
        Some("mod") => {
            parts.pop();
        }
        _ => {}
    }
    Some(parts)
}

/// Every module of the crate and the file that defines it.
fn modules() -> BTreeMap<Module, PathBuf> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files
        .into_iter()
        .filter_map(|file| {
            let rel = file.strip_prefix(src()).unwrap().to_owned();
            Some((module_of(&rel)?, file))
        })
        .collect()
}

/// The code of a file without its tests, comments and string contents.
fn code(text: &str) -> String {
    // Only the test module at the end is cut (the last `#[cfg(test)] mod x {`): a test-only
    // item before other code must not hide the rest of the file.
    let cut = text
        .rfind("#[cfg(test)]\nmod ")
        .filter(|at| text[*at..].lines().nth(1).is_some_and(|l| l.ends_with('{')));
    // A char literal holding a quote would otherwise flip "inside a string" below.
    let text = text[..cut.unwrap_or(text.len())]
        .replace("'\"'", "' '")
        .replace("'\\\"'", "' '");
    let text = text.as_str();
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_string => {
                chars.next();
            }
            '"' => {
                in_string = !in_string;
                out.push(c);
            }
            '/' if !in_string && chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            _ if in_string => {}
            _ => out.push(c),
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path in `code` that starts with `crate`, `super` or `self`, as its segments; a `use`
/// group (`crate::a::{b, c::d}`) gives one path per member.
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for head in ["crate", "super", "self"] {
        for (at, _) in code.match_indices(head) {
            let before = code[..at].chars().next_back();
            let after = &code[at + head.len()..];
            if before.is_some_and(|c| is_ident(c) || c == ':') || !after.starts_with("::") {
                continue;
            }
            walk(vec![head.to_owned()], &after[2..], &mut out);
        }
    }
    out
}

/// Reads the rest of a path after `prefix::` from `rest`, into `out`.
fn walk(mut prefix: Vec<String>, mut rest: &str, out: &mut Vec<Vec<String>>) {
    loop {
        rest = rest.trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        walk(prefix.clone(), &group[start..i], out);
                        return;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        walk(prefix.clone(), &group[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            return;
        }
        let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
        if name.is_empty() {
            break;
        }
        rest = &rest[name.len()..];
        prefix.push(name);
        match rest.strip_prefix("::") {
            Some(more) => rest = more,
            None => break,
        }
    }
    out.push(prefix);
}

/// What `lib.rs` re-exports at the crate root, item name to the module it comes from: a path
/// through the root (`crate::Service`) counts as naming that module.
fn root_exports() -> BTreeMap<String, Module> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let mut out = BTreeMap::new();
    for line in lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub use "))
    {
        let line = line.trim_end_matches(';');
        let (module, items) = match line.split_once("::{") {
            Some((module, items)) => (module, items.trim_end_matches('}').to_owned()),
            None => match line.rsplit_once("::") {
                Some((module, item)) => (module, item.to_owned()),
                None => continue,
            },
        };
        let module: Module = module.split("::").map(str::to_owned).collect();
        for item in items.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            out.insert(item.to_owned(), module.clone());
        }
    }
    out
}

/// The module of the crate that `path`, written in `file`'s module `here`, names.
fn resolve(path: &[String], here: &Module, modules: &BTreeMap<Module, PathBuf>) -> Option<Module> {
    let (mut base, rest): (Module, &[String]) = match path[0].as_str() {
        "crate" => match path.get(1).and_then(|item| ROOT.get(item)) {
            Some(module) => (module.clone(), &path[2..]),
            None => (Vec::new(), &path[1..]),
        },
        _ => {
            // `self` and `super` count from the file's module (`a/b.rs` and `a/b/mod.rs` are
            // both `a::b`, and `super` is `a` from either).
            let mut base = here.clone();
            let mut rest = path;
            if rest[0] == "self" {
                rest = &rest[1..];
            }
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
            (base, rest)
        }
    };
    base.extend(rest.iter().filter(|s| s.as_str() != "self").cloned());
    (1..=base.len())
        .rev()
        .map(|n| base[..n].to_vec())
        .find(|m| modules.contains_key(m))
}

/// Each module's file-level dependencies on other modules of the crate.
fn graph() -> BTreeMap<Module, BTreeSet<Module>> {
    let modules = modules();
    let mut edges = BTreeMap::new();
    for (module, file) in &modules {
        if module.is_empty() {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        let deps: BTreeSet<Module> = paths(&code(&text))
            .iter()
            .filter_map(|p| resolve(p, module, &modules))
            .filter(|m| m != module && !m.is_empty())
            .collect();
        edges.insert(module.clone(), deps);
    }
    edges
}

/// A cycle through `node`, if there is one reachable from it, as the list of modules on it.
fn find_cycle<N: Clone + Ord>(
    node: &N,
    edges: &BTreeMap<N, BTreeSet<N>>,
    path: &mut Vec<N>,
    done: &mut BTreeSet<N>,
) -> Option<Vec<N>> {
    if let Some(at) = path.iter().position(|m| m == node) {
        let mut cycle = path[at..].to_vec();
        cycle.push(node.clone());
        return Some(cycle);
    }
    if done.contains(node) {
        return None;
    }
    path.push(node.clone());
    for next in edges.get(node).into_iter().flatten() {
        if let Some(cycle) = find_cycle(next, edges, path, done) {
            return Some(cycle);
        }
    }
    path.pop();
    done.insert(node.clone());
    None
}

fn layer_of(module: &Module) -> usize {
    let top = module.first().map(String::as_str).unwrap_or_default();
    LAYERS
        .iter()
        .position(|l| *l == top)
        .unwrap_or_else(|| panic!("`{top}` is not a layer of LAYERS: place it in the order"))
}

#[test]
fn no_file_imports_another_that_imports_it_back() {
    let edges = graph();
    assert!(
        edges.len() > 50,
        "the host's files were not found: {edges:?}"
    );
    let mut done = BTreeSet::new();
    for module in edges.keys() {
        if let Some(cycle) = find_cycle(module, &edges, &mut Vec::new(), &mut done) {
            let names: Vec<String> = cycle.iter().map(|m| m.join("::")).collect();
            panic!(
                "import cycle between the host's files: {}",
                names.join(" -> ")
            );
        }
    }
}

#[test]
fn every_file_uses_only_its_own_layer_and_those_below() {
    let mut against = Vec::new();
    for (module, deps) in graph() {
        for dep in deps {
            if layer_of(&dep) > layer_of(&module) {
                against.push(format!("{} -> {}", module.join("::"), dep.join("::")));
            }
        }
    }
    assert!(
        against.is_empty(),
        "imports against the layer order (a layer uses only those below it: {LAYERS:?}): {against:#?}"
    );
}

#[test]
fn the_checker_finds_cycles_groups_and_relative_paths() {
    let mut edges = BTreeMap::new();
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")] {
        edges
            .entry(from.to_owned())
            .or_insert_with(BTreeSet::new)
            .insert(to.to_owned());
    }
    let cycle = find_cycle(
        &"d".to_owned(),
        &edges,
        &mut Vec::new(),
        &mut BTreeSet::new(),
    );
    assert_eq!(cycle.unwrap(), ["a", "b", "c", "a"]);

    let found = paths(&code(
        "use crate::{config::{A, B}, store::keys};\n// crate::observe::x\nlet s = \"crate::entry\";\nlet _ = super::super::read::X;\nuse self::y::{self};",
    ));
    let strs: Vec<String> = found.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        strs,
        [
            "crate::config::A",
            "crate::config::B",
            "crate::store::keys",
            "super::super::read::X",
            "self::y::self",
        ]
    );
    let modules: BTreeMap<Module, PathBuf> = [
        vec!["pipeline".to_owned()],
        vec!["pipeline".to_owned(), "read".to_owned()],
        vec!["pipeline".to_owned(), "admit".to_owned()],
    ]
    .into_iter()
    .map(|m| (m, PathBuf::new()))
    .collect();
    let here = vec!["pipeline".to_owned(), "admit".to_owned(), "rate".to_owned()];
    assert_eq!(
        resolve(&found[3], &here, &modules),
        Some(vec!["pipeline".to_owned(), "read".to_owned()])
    );

    // A char literal holding a quote hides nothing after it, nor does a test-only item before
    // other code; only the test module at the end is cut.
    let text = "let q = '\"';\n#[cfg(test)]\nmod helpers;\nuse crate::cli::Cli;\n#[cfg(test)]\nmod tests {\n    use crate::service::X;\n}\n";
    let found: Vec<String> = paths(&code(text)).iter().map(|p| p.join("::")).collect();
    assert_eq!(found, ["crate::cli::Cli"]);
    // A path through a root re-export names the module it re-exports.
    let through_root = vec!["crate".to_owned(), "Service".to_owned()];
    let store = vec!["store".to_owned(), "inspect".to_owned()];
    assert_eq!(
        resolve(&through_root, &store, &self::modules()),
        Some(vec!["service".to_owned()])
    );
}

/// The `//!` lines of a file.
fn map_of(file: &Path) -> String {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn lib_rs_lists_the_layers_in_order_and_each_layer_maps_its_modules() {
    let modules = modules();
    let layers: Vec<&str> = modules
        .keys()
        .filter(|m| m.len() == 1)
        .map(|m| m[0].as_str())
        .collect();
    let mut sorted: Vec<&str> = LAYERS.to_vec();
    sorted.sort_unstable();
    assert_eq!(layers, sorted, "the crate root holds exactly the layers");
    let lib = map_of(&src().join("lib.rs"));
    let at: Vec<usize> = LAYERS
        .iter()
        .map(|l| {
            lib.find(&format!("[`{l}`]"))
                .unwrap_or_else(|| panic!("lib.rs's map does not name the layer `{l}`"))
        })
        .collect();
    assert!(at.is_sorted(), "lib.rs's map names the layers out of order");
    let mut missing = Vec::new();
    for (module, file) in &modules {
        if module.len() != 2 {
            continue;
        }
        let layer = &modules[&module[..1].to_vec()];
        let name = &module[1];
        let own = map_of(layer);
        if !own.contains(&format!("[`{name}`]")) && !own.contains(&format!("`{name}`")) {
            missing.push(format!("{} ({})", module.join("::"), file.display()));
        }
    }
    assert!(
        missing.is_empty(),
        "each layer's mod.rs is its map; these modules are missing from theirs: {missing:?}"
    );
}
