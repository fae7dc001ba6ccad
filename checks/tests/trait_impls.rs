//! Every `Storage` implementation in the workspace, tests and tools included, names each of
//! the trait's methods (see `weightbay_checks::impls_leaving_out`).

use std::path::{Path, PathBuf};

use weightbay_checks::{impls_leaving_out, trait_methods};

/// The workspace's root, as cargo says when it runs the test.
fn workspace_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("..")
}

/// Every `.rs` file under `dir`, build output and hidden directories left out.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable directory") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_storage_implementation_names_every_method() {
    let root = workspace_root();
    let trait_source =
        std::fs::read_to_string(root.join("core/src/storage.rs")).expect("core's storage.rs");
    let methods = trait_methods(&trait_source, "Storage");
    assert!(
        methods.contains(&"list".to_owned()) && methods.len() >= 7,
        "the trait was not read: {methods:?}"
    );
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut implementations = 0;
    let mut leaving_out = Vec::new();
    for file in files {
        let source = std::fs::read_to_string(&file).expect("a readable source");
        implementations += source.matches("Storage for ").count();
        for (implementor, left_out) in impls_leaving_out(&source, "Storage", &methods) {
            leaving_out.push(format!(
                "{}: {implementor} leaves out {left_out:?}",
                file.display()
            ));
        }
    }
    assert!(implementations > 10, "the sources were not read");
    assert!(
        leaving_out.is_empty(),
        "implementations that fall back to a default (forward each method, or answer it on \
         purpose):\n{}",
        leaving_out.join("\n")
    );
}
