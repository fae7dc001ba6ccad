//! The saves a [`Checkpoints`](crate::Checkpoints) value has in flight: at most one
//! single-process save or copy at a time (a second waits), any number of rank saves side by
//! side, and the failures of background saves nobody was there to see. `gc` reads it so it
//! never removes what a save of this process is still writing.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use weightbay::{Error, Result};

/// The save in flight, and the failures of background saves whose handles were dropped.
#[derive(Debug, Default)]
pub(crate) struct Saves {
    state: Mutex<SavesState>,
    pub(crate) finished: Condvar,
}

#[derive(Debug, Default)]
pub(crate) struct SavesState {
    /// The step and save directory being written, if any.
    pub(crate) in_flight: Option<(u64, String)>,
    /// The save directories of rank saves being written ([`Checkpoints::save_rank`](crate::Checkpoints::save_rank)): several
    /// ranks may run in one process, side by side.
    pub(crate) ranks_in_flight: Vec<String>,
    /// Failures nobody was there to see: reported by the next save or [`Checkpoints::flush`](crate::Checkpoints::flush).
    pub(crate) unobserved: Vec<Error>,
}

impl Saves {
    pub(crate) fn lock(&self) -> MutexGuard<'_, SavesState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until no save is in flight, then marks `save` as in flight until the returned
    /// guard is dropped (a panic on the way ends it too, so nothing waits for ever). Returns
    /// the failures of earlier background saves nobody saw, which the caller reports instead
    /// of saving.
    pub(crate) fn begin(self: &Arc<Self>, save: (u64, String)) -> Result<InFlight> {
        let mut state = self.lock();
        while state.in_flight.is_some() {
            state = self
                .finished
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if let Some(error) = take_unobserved(&mut state) {
            return Err(error);
        }
        state.in_flight = Some(save);
        Ok(InFlight(Arc::clone(self)))
    }

    /// Waits until no save of `step` is in flight (a background save being written, which a
    /// promotion of it must not read before it commits).
    pub(crate) fn wait_while_saving(&self, step: u64) {
        let mut state = self.lock();
        while state
            .in_flight
            .as_ref()
            .is_some_and(|(saving, _)| *saving == step)
        {
            state = self
                .finished
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// A save in flight ([`Saves::begin`]): dropping it ends the save.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Saves>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.lock().in_flight = None;
        self.0.finished.notify_all();
    }
}

/// One error for every unobserved failure (the first as the cause), or `None`.
pub(crate) fn take_unobserved(state: &mut SavesState) -> Option<Error> {
    let mut failures = std::mem::take(&mut state.unobserved);
    if failures.is_empty() {
        return None;
    }
    let count = failures.len();
    let first = failures.remove(0);
    Some(
        Error::new(
            first.kind(),
            format!(
                "{count} background save(s) failed after their handles were dropped; the first"
            ),
        )
        .with_source(first),
    )
}
