//! Peak memory while streaming deferred tensors as a multipart upload (LocalFileSystem store,
//! 64 KiB parts, 3 in flight).

mod support;

weightbay_conformance::memory_bound!(support::ByUrl::local_fs());
