//! A storage decorator that counts the bytes a copy writes, to drive the progress bar, and
//! stops its writes on Ctrl-C.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use weightbay::{
    CreateOptions, Error, ErrorKind, PositionedWrite, ReadBack, Result, Sink, Storage,
};

/// Forwards to a storage; its sinks report progress, and fail with
/// [`ErrorKind::Interrupted`] once the cancel flag is set (the sink is then dropped, which
/// aborts it). The bar draws only on a terminal.
#[derive(Debug)]
pub(crate) struct Counting {
    inner: Arc<dyn Storage>,
    bar: ProgressBar,
    cancel: Arc<AtomicBool>,
}

impl Counting {
    pub(crate) fn new(inner: Arc<dyn Storage>, total: u64) -> Self {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Self {
            inner,
            bar,
            cancel: Arc::default(),
        }
    }

    /// Stops every write once `cancel` is set.
    pub(crate) fn with_cancel(mut self, cancel: Arc<AtomicBool>) -> Self {
        self.cancel = cancel;
        self
    }

    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

// Every method forwarded: one left to the trait's default answers `Unsupported` through the
// wrapper (a copy's check before its commit lists the step).
#[deny(clippy::missing_trait_methods)]
impl Storage for Counting {
    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
        Ok(Box::new(CountingSink {
            inner: self.inner.create(key, options)?,
            bar: self.bar.clone(),
            cancel: Arc::clone(&self.cancel),
        }))
    }
    weightbay::forward_storage!(inner => capabilities, open, delete, pending, clean_pending, list, list_foreign);
}

struct CountingSink {
    inner: Box<dyn Sink>,
    bar: ProgressBar,
    cancel: Arc<AtomicBool>,
}

/// Fails once the cancel flag is set.
fn check_cancel(cancel: &AtomicBool) -> Result<()> {
    if cancel.load(Ordering::SeqCst) {
        return Err(Error::new(
            ErrorKind::Interrupted,
            "interrupted; the destination is as it was",
        ));
    }
    Ok(())
}

/// A counting sink's writes by position, counted and cancelled as its appends are.
struct CountingWrites<'a> {
    inner: Box<dyn PositionedWrite + 'a>,
    bar: ProgressBar,
    cancel: &'a AtomicBool,
}

impl PositionedWrite for CountingWrites<'_> {
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        check_cancel(self.cancel)?;
        self.inner.write_at(offset, data)?;
        self.bar.inc(data.len() as u64);
        Ok(())
    }
}

// Every method forwarded, as for the storage.
#[deny(clippy::missing_trait_methods)]
impl Sink for CountingSink {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        check_cancel(&self.cancel)?;
        self.inner.write(data)?;
        self.bar.inc(data.len() as u64);
        Ok(())
    }
    fn pad(&mut self, len: u64) -> Result<()> {
        check_cancel(&self.cancel)?;
        self.inner.pad(len)?;
        self.bar.inc(len);
        Ok(())
    }
    fn commit(self: Box<Self>) -> Result<()> {
        check_cancel(&self.cancel)?;
        self.inner.commit()
    }
    fn read_back(&self) -> Option<Arc<dyn ReadBack>> {
        self.inner.read_back()
    }
    fn positioned(&mut self) -> Option<Box<dyn PositionedWrite + '_>> {
        Some(Box::new(CountingWrites {
            inner: self.inner.positioned()?,
            bar: self.bar.clone(),
            cancel: &self.cancel,
        }))
    }
}

#[cfg(test)]
mod tests {
    use weightbay::MemoryStorage;
    use weightbay_conformance::{Case, Harness, verdict};

    use super::*;

    /// The counting wrapper over the in-memory reference backend.
    struct CountingMemory;

    impl Harness for CountingMemory {
        type Storage = Counting;

        fn fresh(&self) -> Counting {
            Counting::new(Arc::new(MemoryStorage::new()), 0)
        }

        fn reopen(&self, storage: &Counting) -> Counting {
            Counting::new(Arc::clone(&storage.inner), 0)
        }

        fn not_applicable(&self) -> &[Case] {
            // As for the memory backend: nothing outlives the process, nothing goes through a
            // file system. The memory bound needs the counting allocator, which only a test
            // binary of its own installs (`memory_bound!`).
            &[
                Case::PowerLossAtEveryOperation,
                Case::CompressedSavesSurvivePowerLoss,
                Case::FileSystemFaultAtEveryOperation,
                Case::CreateNewRaceStepByStep,
                Case::ProcessCrashAtEveryStep,
                Case::CompressedSavesSurviveKills,
                Case::PeakMemoryIsBounded,
            ]
        }

        fn write_buffer_bound(&self, container_len: u64) -> u64 {
            container_len
        }
    }

    /// A wrapper answers for every method of what it wraps: the whole conformance suite runs
    /// through it (one that left `list` to the trait's default failed the listing cases).
    #[test]
    fn the_counting_wrapper_passes_the_conformance_suite() {
        let harness = CountingMemory;
        for &case in Case::ALL {
            if let Err(message) = verdict(&harness, case, case.run(&harness, case.name())) {
                panic!("{message}");
            }
        }
    }
}
