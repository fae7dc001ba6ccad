//! Retention on both tiers of a [`Tiered`](crate::Tiered) value:
//! [`Tiered::retain`](crate::Tiered::retain), and the pass after each promotion when
//! [`Tiered::with_retention`](crate::Tiered::with_retention) set a policy. The fast tier keeps
//! what waits for promotion and the step a resumed run is served.

use std::sync::PoisonError;

use weightbay::{Error, ErrorKind, Result};

use crate::listing::{StepState, complete_steps};
use crate::promoter::Tiers;
use crate::retention::{PerTier, Retention};

impl Tiers {
    /// See [`Tiered::retain`](crate::Tiered::retain).
    pub(crate) fn retain(&self, policy: &PerTier<Retention>) -> Result<PerTier<Vec<u64>>> {
        let _pass = self.passes.lock().unwrap_or_else(PoisonError::into_inner);
        let mut doomed = self.fast.retention_plan(&policy.fast)?;
        let listed = self.fast.list()?;
        let rank_parts: Vec<u64> = listed
            .iter()
            .filter(|s| s.state == StepState::Uncommitted && s.ranks.is_some())
            .map(|s| s.step)
            .collect();
        if !rank_parts.is_empty() {
            let newest = self.durable.steps()?.last().copied();
            doomed.extend(rank_parts.into_iter().filter(|&s| Some(s) <= newest));
            doomed.sort_unstable();
        }
        // Pending steps are known under the lock; the deletes run outside it, or every save
        // queueing its promotion meanwhile would wait for them. A step queued after this is
        // almost always a newer save's, or the newest trusted one (resuming). One that meets
        // its deletion (an explicit `promote` of a doomed step) fails, or lands with every byte
        // checked against the record read before: the durable tier never commits other bytes.
        //
        // The newest fast step not known to be torn is the one `latest` serves a resumed run,
        // which may still be reading it: it stays, even where the policy, counting a torn step
        // above it as complete, would delete it. Without a torn step, no policy deletes it. A pass
        // that ran before `latest` found the tear cannot know of it, and may still delete it.
        {
            let queue = self.promoter.lock();
            let served = complete_steps(&listed)
                .into_iter()
                .rev()
                .find(|step| !queue.torn.contains(step));
            doomed.retain(|&step| !queue.is_pending(step) && Some(step) != served);
        }
        self.fast.delete_steps(&doomed)?;
        let durable = self.durable.retain(&policy.durable)?;
        Ok(PerTier {
            fast: doomed,
            durable,
        })
    }

    /// The pass of the policy set by [`Tiered::with_retention`](crate::Tiered::with_retention)
    /// after a promotion ended, counted in [`Queue::retaining`](crate::promoter::Queue::retaining) by the caller. A failure (a
    /// panic too: the worker must go on, or `flush` would wait for ever) is kept for `flush`;
    /// a pass that succeeds forgets it.
    pub(crate) fn retain_after_promotion(&self, policy: &PerTier<Retention>) {
        let retained =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.retain(policy)))
                .unwrap_or_else(|_| {
                    Err(Error::new(
                        ErrorKind::Io,
                        "the retention pass after a promotion panicked",
                    ))
                });
        let mut queue = self.promoter.lock();
        queue.retaining -= 1;
        queue.retention_failure = retained.err();
        self.promoter.changed.notify_all();
    }
}
