//! A storage decorator that counts the bytes a copy writes, to drive the progress bar.

use std::sync::Arc;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use weightbay::{Capabilities, CreateOptions, PendingWrite, Result, Sink, Source, Storage};

/// Forwards to a storage; its sinks report progress. The bar draws only on a terminal.
#[derive(Debug)]
pub(crate) struct Counting {
    inner: Arc<dyn Storage>,
    bar: ProgressBar,
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
        Self { inner, bar }
    }

    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Storage for Counting {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
        Ok(Box::new(CountingSink {
            inner: self.inner.create(key, options)?,
            bar: self.bar.clone(),
        }))
    }
    fn open(&self, key: &str) -> Result<Arc<dyn Source>> {
        self.inner.open(key)
    }
    fn delete(&self, key: &str) -> Result<()> {
        self.inner.delete(key)
    }
    fn pending(&self, prefix: &str) -> Result<Vec<PendingWrite>> {
        self.inner.pending(prefix)
    }
    fn clean_pending(&self, prefix: &str) -> Result<Vec<PendingWrite>> {
        self.inner.clean_pending(prefix)
    }
}

struct CountingSink {
    inner: Box<dyn Sink>,
    bar: ProgressBar,
}

impl Sink for CountingSink {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        self.inner.write(data)?;
        self.bar.inc(data.len() as u64);
        Ok(())
    }
    fn pad(&mut self, len: u64) -> Result<()> {
        self.inner.pad(len)?;
        self.bar.inc(len);
        Ok(())
    }
    fn commit(self: Box<Self>) -> Result<()> {
        self.inner.commit()
    }
}
