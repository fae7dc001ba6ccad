//! The module graph of a crate, read from its sources, so a test can hold every crate of the
//! workspace to one rule: its modules form a tree of layers without an import cycle (a
//! format module never needs the reader, a record type never needs the code that saves it).
//!
//! An edge runs from the module that names a path to the module that defines what it names:
//! `crate::…`, `super::…` and `self::…` paths, and paths that start with a child module's name
//! (`ranks::progress(..)` in the module that declares `mod ranks;`), in `use` trees (groups
//! such as `use super::{a, b::c}` expanded) and inline alike. Re-exports at the crate root are
//! followed to the module that defines the item. Comments do not count, so doc examples and
//! intra-doc links make no edges, nor do string literals; nor does an inline test module at the end of a file
//! (`#[cfg(test)] mod tests { use super::*; … }`), whose `super` is the file's own module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::source::{code_of, rust_files};

/// A module path (`format::burnpack`; empty for the crate root) and the modules it uses.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// Module path of a source file under `src`.
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .filter(|part| part != "mod" && part != "lib" && part != "main")
        .collect();
    parts.join("::")
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into full paths.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree).trim();
        return vec![path.to_owned()];
    };
    let prefix = tree[..open].trim_end_matches("::");
    // A group closes after it opens; text that does not (no code, but a check must not panic
    // on it) is read to its end.
    let close = tree
        .rfind('}')
        .filter(|&close| close > open)
        .unwrap_or(tree.len());
    let inner = &tree[open + 1..close];
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

/// Whether `code[at..]` starts an identifier (nothing word-like or `::` just before it).
fn starts_path(code: &str, at: usize) -> bool {
    let before = &code[..at];
    !before.ends_with("::")
        && !before
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// The paths `module`'s `code` names, made absolute (without `crate::`): `crate::`, `super::`
/// and `self::` paths, and those starting with one of `children` (the modules it declares).
fn paths_named(module: &str, code: &str, children: &BTreeSet<String>) -> Vec<String> {
    let mut trees = Vec::new();
    // `use` statements, which may span lines.
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let after = &rest[at + 4..];
        let end = after.find(';').unwrap_or(after.len());
        if starts_path(rest, at) {
            trees.extend(expand(&after[..end]));
        }
        rest = &after[end.min(after.len())..];
    }
    // Inline paths, such as `crate::format::burnpack::looks_like(..)` or `ranks::progress(..)`.
    let starts = ["crate", "super", "self"]
        .into_iter()
        .map(str::to_owned)
        .chain(children.iter().cloned());
    for start in starts {
        let needle = format!("{start}::");
        let mut offset = 0;
        while let Some(found) = code[offset..].find(&needle) {
            let at = offset + found;
            let tail = &code[at..];
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            if starts_path(code, at) {
                trees.push(tail[..end].to_owned());
            }
            offset = at + end.max(1);
        }
    }
    let parent = |module: &str| module.rsplit_once("::").map_or("", |(p, _)| p).to_owned();
    let join = |base: &str, rest: &str| {
        if base.is_empty() {
            rest.to_owned()
        } else {
            format!("{base}::{rest}")
        }
    };
    trees
        .into_iter()
        .filter_map(|path| {
            // `crate::{a, b}` scanned inline stops at the brace; its `use` expansion counts.
            let path = path.replace(char::is_whitespace, "");
            let path = path.trim_end_matches("::");
            if let Some(rest) = path.strip_prefix("crate::") {
                Some(rest.to_owned())
            } else if let Some(mut rest) = path.strip_prefix("super::") {
                let mut base = parent(module);
                while let Some(further) = rest.strip_prefix("super::") {
                    base = parent(&base);
                    rest = further;
                }
                Some(join(&base, rest))
            } else if let Some(rest) = path.strip_prefix("self::") {
                Some(join(module, rest))
            } else {
                let first = path.split("::").next().unwrap_or_default();
                children.contains(first).then(|| join(module, path))
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

/// The module graph of the crate whose sources are under `src` (its `lib.rs` the root).
///
/// # Errors
/// The file system's, reading the sources.
pub fn graph(src: &Path) -> std::io::Result<Graph> {
    let mut files = Vec::new();
    rust_files(src, &mut files)?;
    let sources = files
        .iter()
        .map(|file| {
            Ok((
                module_of(src, file),
                code_of(&std::fs::read_to_string(file)?),
            ))
        })
        .collect::<std::io::Result<Vec<(String, String)>>>()?;
    let modules: BTreeSet<String> = sources.iter().map(|(m, _)| m.clone()).collect();
    let children_of = |module: &str| -> BTreeSet<String> {
        modules
            .iter()
            .filter_map(|m| {
                let rest = if module.is_empty() {
                    m.as_str()
                } else {
                    m.strip_prefix(module)?.strip_prefix("::")?
                };
                (!rest.is_empty() && !rest.contains("::")).then(|| rest.to_owned())
            })
            .collect()
    };
    // `pub use module::{A, B}` at the root: A and B live in `module`.
    let mut reexports = BTreeMap::new();
    if let Some((_, root)) = sources.iter().find(|(m, _)| m.is_empty()) {
        for statement in root.split(';') {
            let Some(tree) = statement.trim().strip_prefix("pub use ") else {
                continue;
            };
            for path in expand(tree) {
                if let Some((module, name)) = path.rsplit_once("::") {
                    let name = name.rsplit(" as ").next().unwrap_or(name).trim();
                    reexports.insert(name.to_owned(), module.trim().to_owned());
                }
            }
        }
    }
    let mut edges = Graph::new();
    for (module, code) in &sources {
        for path in paths_named(module, code, &children_of(module)) {
            let to = target(&path, &modules, &reexports);
            if &to != module && modules.contains(&to) {
                edges.entry(module.clone()).or_default().insert(to);
            }
        }
    }
    Ok(edges)
}

/// A cycle in `edges`, as the modules along it (the first repeated last), if there is one.
pub fn find_cycle(edges: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &Graph,
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
