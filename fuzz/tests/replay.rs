//! Every committed seed (valid containers, edge cases, and every crash the fuzzers found,
//! minimized) replayed through the same target bodies, on stable Rust.

use std::path::Path;

fn replay(target: &str, body: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let input = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| body(&input));
        assert!(outcome.is_ok(), "{target} panicked on seed {}", path.display());
        count += 1;
    }
    assert!(count > 0, "no seeds in {}", dir.display());
    eprintln!("{target}: {count} seeds replayed");
}

#[test]
fn reader_seeds() {
    replay("reader", weightbay_fuzz::reader);
}

#[test]
fn codec_seeds() {
    replay("codec", weightbay_fuzz::codec);
}

#[test]
fn roundtrip_seeds() {
    replay("roundtrip", weightbay_fuzz::roundtrip);
}

/// The storage-operation seeds against every backend that runs without a server.
#[test]
fn storage_ops_seeds() {
    for backend in ["memory", "local", "mmap", "object-memory", "object-local"] {
        // SAFETY: no other thread of this test binary reads or writes the environment: the
        // other tests never call `backend_name`.
        unsafe { std::env::set_var("WEIGHTBAY_FUZZ_BACKEND", backend) };
        replay("storage_ops", weightbay_fuzz::storage_ops);
    }
}
