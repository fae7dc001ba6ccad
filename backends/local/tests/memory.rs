//! Peak memory while saving deferred tensors to local files.

mod support;

weightbay_conformance::memory_bound!(support::Local::default());
