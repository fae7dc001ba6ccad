//! Forwarding for wrappers: the methods a wrapper does not change, forwarded by name
//! ([`forward_storage!`](crate::forward_storage), [`forward_sink!`](crate::forward_sink)).

/// Inside an `impl Storage for Wrapper` block: the named methods of
/// [`Storage`](crate::Storage), each forwarded to the field named first (`inner`, `0`, or a path
/// of fields such as `gate.inner`) holding a storage: `Arc<dyn Storage>`, `Box<dyn Storage>`,
/// a `S: Storage`.
/// `forward_storage!(inner => capabilities, open, list)`.
///
/// A wrapper writes the methods it changes and forwards the rest by name, under
/// `#[deny(clippy::missing_trait_methods)]`: a method neither written nor forwarded then fails
/// the build, where leaving it to the trait's default would answer `Unsupported` through the
/// wrapper, and only once a feature calls it.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use weightbay::{CreateOptions, MemoryStorage, Result, Sink, Storage, forward_storage};
///
/// /// Counts the sinks it creates; everything else is the inner storage's.
/// #[derive(Debug)]
/// struct Counted {
///     inner: Arc<dyn Storage>,
///     created: AtomicUsize,
/// }
///
/// #[deny(clippy::missing_trait_methods)]
/// impl Storage for Counted {
///     fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
///         self.created.fetch_add(1, Ordering::SeqCst);
///         self.inner.create(key, options)
///     }
///     forward_storage!(inner => capabilities, open, delete, pending, clean_pending, list, list_foreign);
/// }
///
/// let counted = Counted { inner: Arc::new(MemoryStorage::new()), created: AtomicUsize::new(0) };
/// counted.create("a", &CreateOptions::default())?.commit()?;
/// assert_eq!(counted.list("")?.len(), 1);
/// assert_eq!(counted.created.load(Ordering::SeqCst), 1);
/// # Ok::<(), weightbay::Error>(())
/// ```
#[macro_export]
macro_rules! forward_storage {
    ($($field:tt).+ => $($method:ident),+ $(,)?) => {
        $crate::__forward_storage_methods!([$($field).+] $($method)+);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __forward_storage_methods {
    ([$($path:tt)+]) => {};
    ([$($path:tt)+] capabilities $($rest:ident)*) => {
        fn capabilities(&self) -> $crate::Capabilities {
            self.$($path)+.capabilities()
        }
        $crate::__forward_storage_methods!([$($path)+] $($rest)*);
    };
    ([$($path:tt)+] create $($rest:ident)*) => {
        fn create(
            &self,
            key: &str,
            options: &$crate::CreateOptions,
        ) -> $crate::Result<::std::boxed::Box<dyn $crate::Sink>> {
            self.$($path)+.create(key, options)
        }
        $crate::__forward_storage_methods!([$($path)+] $($rest)*);
    };
    ([$($path:tt)+] open $($rest:ident)*) => {
        fn open(&self, key: &str) -> $crate::Result<::std::sync::Arc<dyn $crate::Source>> {
            self.$($path)+.open(key)
        }
        $crate::__forward_storage_methods!([$($path)+] $($rest)*);
    };
    ([$($path:tt)+] delete $($rest:ident)*) => {
        fn delete(&self, key: &str) -> $crate::Result<()> {
            self.$($path)+.delete(key)
        }
        $crate::__forward_storage_methods!([$($path)+] $($rest)*);
    };
    ([$($path:tt)+] pending $($rest:ident)*) => {
        fn pending(&self, prefix: &str) -> $crate::Result<::std::vec::Vec<$crate::PendingWrite>> {
            self.$($path)+.pending(prefix)
        }
        $crate::__forward_storage_methods!([$($path)+] $($rest)*);
    };
    ([$($path:tt)+] clean_pending $($rest:ident)*) => {
        fn clean_pending(
            &self,
            prefix: &str,
        ) -> $crate::Result<::std::vec::Vec<$crate::PendingWrite>> {
            self.$($path)+.clean_pending(prefix)
        }
        $crate::__forward_storage_methods!([$($path)+] $($rest)*);
    };
    ([$($path:tt)+] list $($rest:ident)*) => {
        fn list(&self, prefix: &str) -> $crate::Result<::std::vec::Vec<$crate::Listed>> {
            self.$($path)+.list(prefix)
        }
        $crate::__forward_storage_methods!([$($path)+] $($rest)*);
    };
    ([$($path:tt)+] list_foreign $($rest:ident)*) => {
        fn list_foreign(
            &self,
            prefix: &str,
        ) -> $crate::Result<::std::vec::Vec<$crate::ForeignEntry>> {
            self.$($path)+.list_foreign(prefix)
        }
        $crate::__forward_storage_methods!([$($path)+] $($rest)*);
    };
}

/// Inside an `impl Sink for Wrapper` block: the named methods of [`Sink`](crate::Sink), each
/// forwarded to the field named first (a `Box<dyn Sink>`). `commit` moves the field out of the
/// boxed wrapper, so a wrapper that implements `Drop` writes its own.
/// `forward_sink!(inner => pad, commit, read_back, positioned)`; see
/// [`forward_storage!`](crate::forward_storage). A method left to `Sink`'s default through a
/// wrapper reads nothing back and writes nothing by position.
#[macro_export]
macro_rules! forward_sink {
    ($($field:tt).+ => $($method:ident),+ $(,)?) => {
        $crate::__forward_sink_methods!([$($field).+] $($method)+);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __forward_sink_methods {
    ([$($path:tt)+]) => {};
    ([$($path:tt)+] write $($rest:ident)*) => {
        fn write(&mut self, data: &[u8]) -> $crate::Result<()> {
            self.$($path)+.write(data)
        }
        $crate::__forward_sink_methods!([$($path)+] $($rest)*);
    };
    ([$($path:tt)+] pad $($rest:ident)*) => {
        fn pad(&mut self, len: u64) -> $crate::Result<()> {
            self.$($path)+.pad(len)
        }
        $crate::__forward_sink_methods!([$($path)+] $($rest)*);
    };
    ([$($path:tt)+] commit $($rest:ident)*) => {
        fn commit(self: ::std::boxed::Box<Self>) -> $crate::Result<()> {
            self.$($path)+.commit()
        }
        $crate::__forward_sink_methods!([$($path)+] $($rest)*);
    };
    ([$($path:tt)+] read_back $($rest:ident)*) => {
        fn read_back(&self) -> ::std::option::Option<::std::sync::Arc<dyn $crate::ReadBack>> {
            self.$($path)+.read_back()
        }
        $crate::__forward_sink_methods!([$($path)+] $($rest)*);
    };
    ([$($path:tt)+] positioned $($rest:ident)*) => {
        fn positioned(
            &mut self,
        ) -> ::std::option::Option<::std::boxed::Box<dyn $crate::PositionedWrite + '_>> {
            self.$($path)+.positioned()
        }
        $crate::__forward_sink_methods!([$($path)+] $($rest)*);
    };
}
