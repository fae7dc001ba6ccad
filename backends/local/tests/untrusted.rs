//! A directory is shared ground: symlinks planted under the root are never walked into by a
//! listing and never deleted through, however they are laid out. Each test keeps a canary tree
//! beside the root and checks that every canary byte is still there.

use std::os::unix::fs::symlink;
use std::path::Path;

use weightbay::{ErrorKind, Storage};
use weightbay_local::LocalStorage;

/// A canary tree at `dir`: a run's step with its files, and their bytes.
fn canary(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let step = dir.join("victim-run/step-1");
    std::fs::create_dir_all(&step).unwrap();
    let files = vec![
        (step.join("commit.json"), b"{\"victim\": true}".to_vec()),
        (step.join("model.bpk"), vec![7; 4096]),
    ];
    for (path, bytes) in &files {
        std::fs::write(path, bytes).unwrap();
    }
    files
}

fn assert_intact(files: &[(std::path::PathBuf, Vec<u8>)]) {
    for (path, bytes) in files {
        assert_eq!(
            std::fs::read(path).ok().as_ref(),
            Some(bytes),
            "{} was changed or removed",
            path.display()
        );
    }
}

#[test]
fn deletes_never_go_through_a_symlinked_directory() {
    let top = tempfile::tempdir().unwrap();
    let files = canary(&top.path().join("elsewhere"));
    let root = top.path().join("root");
    std::fs::create_dir_all(root.join("run")).unwrap();
    symlink(
        top.path().join("elsewhere/victim-run/step-1"),
        root.join("run/step-1"),
    )
    .unwrap();
    symlink(top.path().join("elsewhere/victim-run"), root.join("linked")).unwrap();
    let storage = LocalStorage::new(&root);

    assert!(storage.list("run").unwrap().is_empty());
    assert!(storage.list("").unwrap().is_empty());
    for key in ["run/step-1/model.bpk", "linked/step-1/commit.json"] {
        let err = storage.delete(key).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
    }
    assert!(storage.clean_pending("").unwrap().is_empty());
    assert_intact(&files);
    // Reads follow links by design (a Hugging Face cache links its files to blobs).
    assert_eq!(storage.open("run/step-1/model.bpk").unwrap().len(), 4096);
}

#[test]
fn a_symlink_to_a_file_is_listed_and_deleting_it_removes_the_link() {
    let top = tempfile::tempdir().unwrap();
    let files = canary(&top.path().join("elsewhere"));
    let root = top.path().join("root");
    std::fs::create_dir_all(root.join("snapshot")).unwrap();
    symlink(&files[1].0, root.join("snapshot/model.bpk")).unwrap();
    let storage = LocalStorage::new(&root);
    let listed = storage.list("snapshot").unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].key.as_str(), listed[0].len),
        ("snapshot/model.bpk", 4096)
    );
    storage.delete("snapshot/model.bpk").unwrap();
    assert!(!root.join("snapshot/model.bpk").exists());
    assert_intact(&files);
}

#[test]
fn loops_and_deep_link_trees_cost_nothing() {
    let top = tempfile::tempdir().unwrap();
    let root = top.path().join("root");
    // 25 levels, each with two links to the next: a walk that follows links visits 2^25 dirs.
    let mut dir = root.join("run");
    for level in 0..25 {
        let next = dir.join(format!("d{level}"));
        std::fs::create_dir_all(&next).unwrap();
        symlink(&next, dir.join("a")).unwrap();
        symlink(&next, dir.join("b")).unwrap();
        dir = next;
    }
    std::fs::write(dir.join("model.bpk"), [1; 8]).unwrap();
    symlink(&root, root.join("run/loop")).unwrap();
    symlink(root.join("nowhere"), root.join("run/dangling")).unwrap();
    let storage = LocalStorage::new(&root);
    // A walk that followed the links would not end: this returns at all only if none does.
    let listed = storage.list("run").unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(listed[0].key.ends_with("d24/model.bpk"));
    assert!(storage.pending("run").unwrap().is_empty());
    assert_eq!(
        storage
            .delete("run/loop/run/d0/model.bpk")
            .unwrap_err()
            .kind(),
        storage.delete("run/a/model.bpk").unwrap_err().kind()
    );
    assert_ne!(
        storage.delete("run/missing.bpk").unwrap_err().kind(),
        ErrorKind::Io,
        "a missing key is NotFound"
    );
}
