//! What a backend author builds a [`Storage`](crate::Storage) from, beyond the traits: the key
//! rules every backend applies, the range and length checks the contracts name, batched and
//! lazy reads a [`Source`](crate::Source) can return, and the file-system seam the local
//! backend does its I/O through (so the conformance suite can run it on a simulated disk).
//! Users who only save and load never need this module.

pub use crate::batched_reads::{fetch_views, read_at_parallel, read_in_order};
pub use crate::copy::{copy_by_position, copy_to_sink};
pub use crate::fs::{EntryKind, FileHandle, FileSystem, HeldDir, hold_dir_plainly};
pub use crate::keys::{
    MAX_KEY_LEN, is_under, is_unique_token, unique_token, validate_key, validate_prefix,
};
pub use crate::lazy::lazy_bytes;
pub use crate::options::check_deadline;
pub use crate::ranges::{check_jobs, check_range, check_ranges, check_written};
pub use crate::reader::OPEN_PREFIX_LEN;
pub use crate::storage::{PIECE_LEN, pad_with_zeros};
