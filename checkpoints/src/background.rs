//! Saving in the background: the save runs on a thread of its own while training goes on,
//! one at a time, and a failure is never lost, even when its handle is dropped.

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, PoisonError};

use weightbay::backend_kit::unique_token;
use weightbay::{Background, Error, ErrorKind, Result, Writer};

use crate::following::Followed;
use crate::in_flight::{Saves, take_unobserved};
use crate::record::CommitRecord;
use crate::run::Checkpoints;
use crate::save::SaveOptions;

impl Checkpoints {
    /// Starts saving the checkpoint of `step` on a thread of its own and returns at once, so
    /// training goes on while it streams out. One save is in flight at a time: when one is,
    /// this call first **waits** for it to end (a training loop saving faster than its storage
    /// takes is held back rather than piling up checkpoints in memory).
    ///
    /// The outcome comes back through the handle. A handle dropped before the save ends does
    /// not cancel it: the save completes or removes what it wrote, and if it failed, the next
    /// save or [`flush`](Self::flush) reports that failure, so it is never lost silently.
    ///
    /// # Errors
    /// The failure of an earlier background save whose handle was dropped (then nothing is
    /// started); [`ErrorKind::Io`] when the thread cannot start.
    pub fn save_in_background(
        &self,
        step: u64,
        writer: Writer,
        options: SaveOptions,
    ) -> Result<SaveHandle> {
        self.save_in_background_followed(step, writer, options, || None)
            .map(|(handle, _)| handle)
    }

    /// [`save_in_background`](Self::save_in_background), announcing each container to the
    /// follower `follow` gives once the save has its turn (see
    /// [`Recording::followed_by`](crate::committed_containers::Recording::followed_by)). Also returns
    /// whether it had one.
    pub(crate) fn save_in_background_followed(
        &self,
        step: u64,
        writer: Writer,
        options: SaveOptions,
        follow: impl FnOnce() -> Option<Sender<Followed>>,
    ) -> Result<(SaveHandle, bool)> {
        let save_dir = format!("{}/{}", self.step_dir(step), unique_token());
        let in_flight = self.saves.begin((step, save_dir.clone()))?;
        let follower = follow();
        let followed = follower.is_some();
        let outcome = Arc::new(Mutex::new(Outcome::Running));
        let (checkpoints, theirs) = (self.clone(), Arc::clone(&outcome));
        // The guard travels with the work: the save ends when the work does, a panic included,
        // or at once if the thread cannot start.
        let work = Background::spawn("weightbay-checkpoint", move || {
            let result = checkpoints.write_and_commit(step, &save_dir, writer, options, follower);
            let mut outcome = theirs.lock().unwrap_or_else(PoisonError::into_inner);
            match (&*outcome, result) {
                (Outcome::Abandoned, Err(e)) => checkpoints.saves.lock().unobserved.push(e),
                (Outcome::Abandoned, Ok(_)) => {}
                (_, result) => *outcome = Outcome::Done(Box::new(result)),
            }
            drop(outcome);
            drop(in_flight);
        })?;
        let handle = SaveHandle {
            step,
            work: Some(work),
            outcome,
            saves: Arc::clone(&self.saves),
        };
        Ok((handle, followed))
    }

    /// Waits for the save in flight, if any, and reports the failures of background saves
    /// whose handles were dropped. Call it before a program exits.
    ///
    /// # Errors
    /// Those failures, as one error (the first as its cause).
    pub fn flush(&self) -> Result<()> {
        let mut state = self.saves.lock();
        while state.in_flight.is_some() {
            state = self
                .saves
                .finished
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        take_unobserved(&mut state).map_or(Ok(()), Err)
    }
}

/// The handle of a save running in the background: [`wait`](Self::wait) for it from sync
/// code, `.await` it from async code.
#[derive(Debug)]
pub struct SaveHandle {
    step: u64,
    work: Option<Background<()>>,
    outcome: Arc<Mutex<Outcome>>,
    saves: Arc<Saves>,
}

/// Where a background save's result goes.
#[derive(Debug)]
enum Outcome {
    Running,
    /// Boxed: a commit record is large, and the outcome waits in a mutex.
    Done(Box<Result<CommitRecord>>),
    /// The handle was dropped first: a failure goes to the next save instead.
    Abandoned,
}

impl SaveHandle {
    /// The step being saved.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Whether the save has ended (so `wait` would not block).
    pub fn is_finished(&self) -> bool {
        self.work.as_ref().is_none_or(Background::is_finished)
    }

    /// Blocks until the save ends, and returns its commit record.
    ///
    /// # Errors
    /// As [`Checkpoints::save_with`].
    pub fn wait(mut self) -> Result<CommitRecord> {
        if let Some(work) = self.work.take() {
            work.wait();
        }
        self.take()
    }

    fn take(&self) -> Result<CommitRecord> {
        let mut outcome = self.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        match std::mem::replace(&mut *outcome, Outcome::Abandoned) {
            Outcome::Done(result) => *result,
            // The worker stores its result before it ends; reaching here means it panicked.
            _ => Err(Error::new(
                ErrorKind::Io,
                format!("the background save of step {} panicked", self.step),
            )),
        }
    }
}

impl std::future::Future for SaveHandle {
    type Output = Result<CommitRecord>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        if let Some(work) = self.work.as_mut() {
            match std::pin::Pin::new(work).poll(cx) {
                std::task::Poll::Pending => return std::task::Poll::Pending,
                std::task::Poll::Ready(()) => self.work = None,
            }
        }
        std::task::Poll::Ready(self.take())
    }
}

impl Drop for SaveHandle {
    /// Dropped before the outcome was taken: a failure goes to the checkpoints' unobserved
    /// list, which the next save or [`Checkpoints::flush`] reports.
    fn drop(&mut self) {
        if self.work.is_none() {
            return;
        }
        let mut outcome = self.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        match std::mem::replace(&mut *outcome, Outcome::Abandoned) {
            Outcome::Done(result) => {
                if let Err(e) = *result {
                    self.saves.lock().unobserved.push(e);
                }
            }
            Outcome::Running | Outcome::Abandoned => {}
        }
    }
}
