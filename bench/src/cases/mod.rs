//! The cases, one file per subject.

pub(crate) mod burn;
pub(crate) mod candle;
pub(crate) mod codec;
pub(crate) mod cold_start;
pub(crate) mod compressed;
pub(crate) mod device;
pub(crate) mod encode;
pub(crate) mod export;
pub(crate) mod faults;
pub(crate) mod gc;
pub(crate) mod incremental;
pub(crate) mod lifecycle;
pub(crate) mod load;
pub(crate) mod object_store;
pub(crate) mod python_pair;
pub(crate) mod ranks;
pub(crate) mod remote;
pub(crate) mod rss_probe;
pub(crate) mod save;
pub(crate) mod stall;
pub(crate) mod tiered;
