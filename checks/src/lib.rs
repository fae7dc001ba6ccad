//! Checks of the workspace's own shape, read from its sources, that its tests hold every crate
//! to:
//! - [`graph`] and [`find_cycle`]: the modules of a crate form a tree of layers without an
//!   import cycle;
//! - [`trait_methods`] and [`impls_leaving_out`]: an implementation of a trait names every one
//!   of the trait's methods, so a wrapper never falls back silently to a default that answers
//!   for it (a `Storage` wrapper that leaves `list` out answers `Unsupported` through it).

mod module_graph;
mod source;
mod trait_impls;

pub use module_graph::{Graph, find_cycle, graph};
pub use trait_impls::{impls_leaving_out, trait_methods};
