//! No crate of the workspace, library or program, has an import cycle between its modules.

use std::path::PathBuf;

use weightbay_checks::{find_cycle, graph};

/// The workspace's root, as cargo says when it runs the test (the path compiled in is that of
/// the checkout that built the binary, which a target directory shared between checkouts
/// reuses elsewhere).
fn workspace_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("..")
}

/// The workspace members with a library (`src/lib.rs`) or a program (`src/main.rs`), from the
/// root `Cargo.toml`.
fn crates_with_sources() -> Vec<PathBuf> {
    let root = workspace_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("the root Cargo.toml");
    let members = manifest
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .expect("a members list");
    members
        .split(',')
        .map(|member| member.trim().trim_matches('"'))
        .filter(|member| !member.is_empty())
        .map(|member| root.join(member))
        .filter(|dir| dir.join("src/lib.rs").is_file() || dir.join("src/main.rs").is_file())
        .collect()
}

#[test]
fn no_crate_has_an_import_cycle() {
    let crates = crates_with_sources();
    assert!(
        crates.iter().any(|c| c.ends_with("core"))
            && crates.iter().any(|c| c.ends_with("checkpoints"))
            && crates.iter().any(|c| c.ends_with("bench")),
        "the members list was not read: {crates:?}"
    );
    let cycles: Vec<String> = crates
        .iter()
        .filter_map(|dir| {
            let edges = graph(&dir.join("src")).expect("readable sources");
            let cycle = find_cycle(&edges)?;
            Some(format!("{}: {}", dir.display(), cycle.join(" -> ")))
        })
        .collect();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_check_sees_the_edges_it_claims() {
    let root = workspace_root();
    let core = graph(&root.join("core/src")).expect("core's sources");
    assert!(
        core.get("reader").is_some_and(|to| to.contains("format")),
        "reader -> format is missing: {core:#?}"
    );
    let checkpoints = graph(&root.join("checkpoints/src")).expect("the checkpoints' sources");
    assert!(
        checkpoints
            .get("ranks")
            .is_some_and(|to| to.contains("record") && to.contains("layout")),
        "ranks -> record, layout are missing: {checkpoints:#?}"
    );
    // The record schema imports no sibling.
    assert_eq!(checkpoints.get("record"), None, "{checkpoints:#?}");
}

/// Writes `files` as a crate's `src/` and returns the cycle found in it.
fn cycle_in(files: &[(&str, &str)]) -> Option<Vec<String>> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("a directory");
        std::fs::write(path, text).expect("a source file");
    }
    find_cycle(&graph(dir.path()).expect("readable sources"))
}

#[test]
fn a_cycle_through_the_crate_root_is_reported() {
    let cycle = cycle_in(&[
        ("lib.rs", "pub mod a;\npub mod b;\npub use a::Thing;\n"),
        ("a.rs", "use crate::b::Other;\npub struct Thing;\n"),
        (
            "b.rs",
            "pub struct Other;\nfn f() -> crate::Thing { crate::Thing }\n",
        ),
    ])
    .expect("a -> b -> a is a cycle");
    assert_eq!(cycle.first(), cycle.last());
    assert!(cycle.contains(&"a".to_owned()) && cycle.contains(&"b".to_owned()));
}

#[test]
fn a_cycle_through_a_child_and_a_super_group_is_reported() {
    // The shape the checkpoint module once had: the parent calls into its child by the
    // child's name, and the child imports a group from its parent.
    let cycle = cycle_in(&[
        ("lib.rs", "pub mod checkpoints;\n"),
        (
            "checkpoints/mod.rs",
            "mod ranks;\npub const RECORD: &str = \"commit.json\";\nfn f() { ranks::progress(); }\n",
        ),
        (
            "checkpoints/ranks.rs",
            "use super::{RECORD, other};\npub(crate) fn progress() {}\n",
        ),
    ])
    .expect("checkpoints -> ranks -> checkpoints is a cycle");
    assert!(
        cycle.contains(&"checkpoints::ranks".to_owned()),
        "{cycle:?}"
    );
}

#[test]
fn literals_and_comments_make_no_edges_whatever_lines_they_span() {
    // A message continued over lines holds `use` and braces; a raw string holds quotes; a
    // character literal is a quote; a block comment spans lines. None of it is code: only
    // `b`'s real import of `a` is an edge, and there is no cycle.
    let a = concat!(
        "pub fn f() -> String {\n",
        "    let quote = '\"';\n",
        "    format!(\"run `aws \\\n",
        "     configure` and use the variables {} it prints \\\n",
        "     use crate::b::{X, Y}\", quote)\n",
        "}\n",
        "pub const RAW: &str = r#\"use crate::b::Z; \"quoted\" \"#;\n",
        "/* use crate::b::W;\n   still a comment */\n",
        "fn g<'a>(s: &'a str) -> &'a str { s }\n",
    );
    let cycle = cycle_in(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", a),
        ("b.rs", "use crate::a::f;\npub struct X;\npub struct Y;\n"),
    ]);
    assert_eq!(cycle, None);
}

#[test]
fn layers_without_a_cycle_pass() {
    let cycle = cycle_in(&[
        ("lib.rs", "mod a;\nmod b;\npub use b::Top;\n"),
        ("a.rs", "pub struct Bottom;\n"),
        (
            "b.rs",
            "use crate::a::Bottom;\npub struct Top(Bottom);\n// crate::b is not a path\n",
        ),
    ]);
    assert_eq!(cycle, None);
}
