//! No import cycles between core's modules: a format module never needs the reader or the
//! writer, a shared type never needs a format, and so on. The check reads the sources: every
//! `crate::…` and `super::…` path (in `use` trees and inline) is an edge from the module that
//! names it to the module that defines the item, the crate root's `pub use` re-exports
//! followed to their defining module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`format::burnpack`) of a source file under `src/`.
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .filter(|part| part != "mod" && part != "lib")
        .collect();
    parts.join("::")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("core/src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without comments (so doc examples do not count) and without `#[cfg(test)]`
/// modules' contents being special-cased: test modules' imports count like any other.
fn code_of(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into full paths.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree).trim();
        return vec![path.to_owned()];
    };
    let prefix = tree[..open].trim_end_matches("::");
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|part| !part.trim().is_empty())
        .flat_map(expand)
        .map(|path| {
            if path == "self" {
                prefix.to_owned()
            } else {
                format!("{prefix}::{path}")
            }
        })
        .collect()
}

/// Every path the code names that starts with `crate::`, `super::` or `self::`, made absolute
/// (without the leading `crate::`).
fn paths_named(module: &str, code: &str) -> Vec<String> {
    let mut trees = Vec::new();
    // `use` statements, which may span lines.
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let preceded_ok = at == 0
            || !rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_');
        let after = &rest[at + 4..];
        let end = after.find(';').unwrap_or(after.len());
        if preceded_ok {
            trees.extend(expand(&after[..end]));
        }
        rest = &after[end.min(after.len())..];
    }
    // Inline paths, such as `crate::format::burnpack::looks_like(..)`.
    for start in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(at) = rest.find(start) {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            trees.push(tail[..end].to_owned());
            rest = &tail[end..];
        }
    }
    let parent = |module: &str| module.rsplit_once("::").map_or("", |(p, _)| p).to_owned();
    trees
        .into_iter()
        .filter_map(|path| {
            let path = path.replace(' ', "");
            if let Some(rest) = path.strip_prefix("crate::") {
                Some(rest.to_owned())
            } else if let Some(mut rest) = path.strip_prefix("super::") {
                let mut base = parent(module);
                while let Some(further) = rest.strip_prefix("super::") {
                    base = parent(&base);
                    rest = further;
                }
                Some(if base.is_empty() {
                    rest.to_owned()
                } else {
                    format!("{base}::{rest}")
                })
            } else {
                path.strip_prefix("self::")
                    .map(|rest| format!("{module}::{rest}"))
            }
        })
        .collect()
}

/// The module a path names: its longest prefix that is a module, the crate root's re-exports
/// followed.
fn target(path: &str, modules: &BTreeSet<String>, reexports: &BTreeMap<String, String>) -> String {
    let segments: Vec<&str> = path.split("::").collect();
    for len in (1..=segments.len()).rev() {
        let candidate = segments[..len].join("::");
        if modules.contains(&candidate) {
            return candidate;
        }
    }
    reexports.get(segments[0]).cloned().unwrap_or_default()
}

/// The module graph of the crate whose sources are under `src`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let sources: Vec<(String, String)> = files
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(file).expect("a readable source file");
            (module_of(src, file), code_of(&text))
        })
        .collect();
    let modules: BTreeSet<String> = sources.iter().map(|(m, _)| m.clone()).collect();
    let root = &sources
        .iter()
        .find(|(m, _)| m.is_empty())
        .expect("lib.rs")
        .1;
    // `pub use module::{A, B}` at the root: A and B live in `module`.
    let mut reexports = BTreeMap::new();
    for line in root.split(';') {
        let Some(tree) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        for path in expand(tree) {
            if let Some((module, name)) = path.rsplit_once("::") {
                let name = name.rsplit(" as ").next().unwrap_or(name).trim();
                reexports.insert(name.to_owned(), module.trim().to_owned());
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, code) in &sources {
        if module.is_empty() {
            continue; // the root only declares and re-exports
        }
        for path in paths_named(module, code) {
            let to = target(&path, &modules, &reexports);
            if !to.is_empty() && &to != module {
                edges.entry(module.clone()).or_default().insert(to);
            }
        }
    }
    edges
}

/// A cycle in `edges`, as the modules along it, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|node| visit(node, edges, &mut Vec::new(), &mut done))
}

#[test]
fn core_has_no_import_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = graph(&src);
    assert!(
        edges.get("reader").is_some_and(|to| to.contains("format")),
        "the check sees nothing: {edges:#?}"
    );
    if let Some(cycle) = find_cycle(&edges) {
        panic!(
            "import cycle between core's modules: {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn a_cycle_is_reported() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    write("lib.rs", "pub mod a;\npub mod b;\npub use a::Thing;\n");
    write("a.rs", "use crate::b::Other;\npub struct Thing;\n");
    write(
        "b.rs",
        "pub struct Other;\nfn f() -> crate::Thing { crate::Thing }\n",
    );
    let cycle = find_cycle(&graph(dir.path())).expect("a -> b -> a is a cycle");
    assert_eq!(cycle.first(), cycle.last());
    assert!(cycle.contains(&"a".to_owned()) && cycle.contains(&"b".to_owned()));
}
