//! A directory is shared ground: symlinks planted under the root are never walked into by a
//! listing and never deleted through, however they are laid out. Each test keeps a canary tree
//! beside the root and checks that every canary byte is still there.

use std::os::unix::fs::symlink;
use std::path::Path;

use weightbay::{CreateOptions, ErrorKind, Storage, WriteMode};
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

/// A canary tree under `top/elsewhere`, and the root `top/root` with two links into it: the
/// step directory `run/step-1` (to the victim's step) and `linked` (to the victim run).
fn planted_links(top: &Path) -> (Vec<(std::path::PathBuf, Vec<u8>)>, std::path::PathBuf) {
    let files = canary(&top.join("elsewhere"));
    let root = top.join("root");
    std::fs::create_dir_all(root.join("run")).unwrap();
    symlink(
        top.join("elsewhere/victim-run/step-1"),
        root.join("run/step-1"),
    )
    .unwrap();
    symlink(top.join("elsewhere/victim-run"), root.join("linked")).unwrap();
    (files, root)
}

#[test]
fn deletes_never_go_through_a_symlinked_directory() {
    let top = tempfile::tempdir().unwrap();
    let (files, root) = planted_links(top.path());
    let storage = LocalStorage::new(&root);

    assert!(storage.list("run").unwrap().is_empty());
    assert!(storage.list("").unwrap().is_empty());
    for key in ["run/step-1/model.bpk", "linked/step-1/commit.json"] {
        let err = storage.delete(key).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
    }
    assert!(storage.clean_pending("").unwrap().is_empty());
    assert_intact(&files);
    // Each link is reported as what it is, and only as that.
    let foreign = |prefix| -> Vec<String> {
        let entries = storage.list_foreign(prefix).unwrap();
        entries.into_iter().map(|entry| entry.name).collect()
    };
    assert_eq!(foreign("run"), ["run/step-1"]);
    assert_eq!(foreign(""), ["linked", "run/step-1"]);
    // Reads follow links by design (a Hugging Face cache links its files to blobs).
    assert_eq!(storage.open("run/step-1/model.bpk").unwrap().len(), 4096);
}

/// A canary tree under `top/elsewhere`, and the root `top/root` whose `snapshot/model.bpk` is
/// a link to the victim's `model.bpk`, as a Hugging Face cache links its files.
fn linked_file(top: &Path) -> (Vec<(std::path::PathBuf, Vec<u8>)>, std::path::PathBuf) {
    let files = canary(&top.join("elsewhere"));
    let root = top.join("root");
    std::fs::create_dir_all(root.join("snapshot")).unwrap();
    symlink(&files[1].0, root.join("snapshot/model.bpk")).unwrap();
    (files, root)
}

#[test]
fn a_symlink_to_a_file_is_listed_and_deleting_it_removes_the_link() {
    let top = tempfile::tempdir().unwrap();
    let (files, root) = linked_file(top.path());
    let storage = LocalStorage::new(&root);
    assert!(storage.list_foreign("").unwrap().is_empty());
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
    // Two links a level, the loop and the dangling link: each one entry, none followed.
    let foreign = storage.list_foreign("run").unwrap();
    assert_eq!(foreign.len(), 2 * 25 + 2, "{foreign:?}");
    assert!(foreign.iter().any(|entry| entry.name == "run/dangling"));
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

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Writes `bytes` as `key` in `mode`, committed.
fn save(storage: &LocalStorage, key: &str, mode: WriteMode, bytes: &[u8]) -> weightbay::Result<()> {
    let mut sink = storage.create(key, &CreateOptions::default().with_mode(mode))?;
    sink.write(bytes)?;
    sink.commit()
}

#[test]
fn saves_never_go_through_a_symlinked_directory() {
    let top = tempfile::tempdir().unwrap();
    let (files, root) = planted_links(top.path());
    let victim_step = top.path().join("elsewhere/victim-run/step-1");
    let storage = LocalStorage::new(&root);

    for mode in [
        WriteMode::Overwrite,
        WriteMode::CreateNew,
        WriteMode::InPlace,
    ] {
        for key in [
            "run/step-1/model.bpk",
            "run/step-1/other.bpk",
            "linked/step-1/commit.json",
            "linked/step-2/new.bpk",
        ] {
            let err = save(&storage, key, mode, b"planted").unwrap_err();
            assert!(err.to_string().contains("symlink"), "{mode:?} {key}: {err}");
        }
    }
    assert_intact(&files);
    assert_eq!(names_in(&victim_step), ["commit.json", "model.bpk"]);
    assert_eq!(
        names_in(&top.path().join("elsewhere/victim-run")),
        ["step-1"]
    );
}

#[test]
fn a_symlink_swapped_in_after_a_save_began_is_not_written_through() {
    let top = tempfile::tempdir().unwrap();
    let files = canary(&top.path().join("elsewhere"));
    let victim_step = top.path().join("elsewhere/victim-run/step-1");
    let root = top.path().join("root");
    let storage = LocalStorage::new(&root);
    for mode in [WriteMode::Overwrite, WriteMode::CreateNew] {
        let _ = std::fs::remove_file(root.join("run/step-1"));
        let _ = std::fs::remove_dir_all(root.join("run"));
        let mut sink = storage
            .create(
                "run/step-1/model.bpk",
                &CreateOptions::default().with_mode(mode),
            )
            .unwrap();
        sink.write(b"the save's bytes").unwrap();
        // The directory the save began in moves away, and a link to the victim takes its name.
        std::fs::rename(root.join("run/step-1"), root.join("run/moved")).unwrap();
        symlink(&victim_step, root.join("run/step-1")).unwrap();
        sink.commit().unwrap();
        assert_intact(&files);
        assert_eq!(
            names_in(&victim_step),
            ["commit.json", "model.bpk"],
            "{mode:?}"
        );
        assert_eq!(
            std::fs::read(root.join("run/moved/model.bpk")).unwrap(),
            b"the save's bytes",
            "{mode:?}: the save lands in the directory it began in"
        );
    }
}

#[test]
fn an_in_place_save_never_truncates_a_linked_file() {
    let top = tempfile::tempdir().unwrap();
    let (files, root) = linked_file(top.path());
    let storage = LocalStorage::new(&root);
    assert!(save(&storage, "snapshot/model.bpk", WriteMode::InPlace, b"x").is_err());
    assert_intact(&files);
    // An atomic save replaces the link itself, as a name.
    save(&storage, "snapshot/model.bpk", WriteMode::Overwrite, b"new").unwrap();
    assert!(
        !std::fs::symlink_metadata(root.join("snapshot/model.bpk"))
            .unwrap()
            .is_symlink()
    );
    assert_intact(&files);
}
