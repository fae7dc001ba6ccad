//! Promotion policy: which checkpoints a [`Tiered`](crate::Tiered) value copies from its fast
//! tier to its durable one, how long a save may be held back when promotion falls behind, and
//! where each promotion stands ([`PromotionState`]). The queue that carries them out is in
//! [`promoter`](crate::promoter); a promotion that streams a save as it writes, in
//! [`following`](crate::following).

use std::time::Duration;

use weightbay::ErrorKind;

/// Which checkpoints of a [`Tiered`](crate::Tiered) value are promoted to the durable tier,
/// and what a save does when promotion falls behind.
///
/// Saves queue their promotion; one is copied at a time. A save that finds
/// [`max_waiting`](Self::max_waiting) promotions waiting waits up to
/// [`max_block`](Self::max_block) for one to start, then takes the place of the oldest waiting
/// one, which is reported [`Superseded`](PromotionState::Superseded). The default,
/// [`newest_only`](Self::newest_only), never holds a save back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Promotion {
    /// Only checkpoints whose step is a multiple of this are promoted (1: every one); the
    /// others are [`NotChosen`](PromotionState::NotChosen).
    pub multiple_of: u64,
    /// How many promotions may wait behind the one being copied.
    pub max_waiting: usize,
    /// How long a save may be held waiting for room in a full queue before it supersedes the
    /// oldest waiting promotion.
    pub max_block: Duration,
}

impl Default for Promotion {
    fn default() -> Self {
        Self::newest_only()
    }
}

impl Promotion {
    /// Promotes the newest checkpoint: while one is copied, at most one waits, and a newer save
    /// takes its place at once. The durable tier so stays within one promotion of the fast
    /// tier, and saves are never held back.
    pub fn newest_only() -> Self {
        Self {
            multiple_of: 1,
            max_waiting: 1,
            max_block: Duration::ZERO,
        }
    }

    /// Promotes every checkpoint, in order, however far behind promotion falls (the fast tier
    /// keeps each until it is promoted, see [`Tiered::retain`](crate::Tiered::retain)).
    pub fn every_save() -> Self {
        Self {
            max_waiting: usize::MAX,
            ..Self::newest_only()
        }
    }

    /// Promotes only checkpoints whose step is a multiple of `k` (0 counts as 1).
    #[must_use]
    pub fn multiples_of(mut self, k: u64) -> Self {
        self.multiple_of = k.max(1);
        self
    }

    /// Lets `n` promotions wait behind the one being copied (at least 1).
    #[must_use]
    pub fn with_max_waiting(mut self, n: usize) -> Self {
        self.max_waiting = n.max(1);
        self
    }

    /// Lets a save wait up to `bound` for room in a full queue before it supersedes the
    /// oldest waiting promotion.
    #[must_use]
    pub fn with_max_block(mut self, bound: Duration) -> Self {
        self.max_block = bound;
        self
    }
}

/// Where the promotion of one checkpoint stands, as this process saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PromotionState {
    /// Queued behind the promotion being copied.
    Waiting,
    /// Being copied to the durable tier.
    Copying,
    /// On the durable tier: the checkpoint complete, or, for a rank's part
    /// ([`Tiered::save_rank`](crate::Tiered::save_rank)), the part and its manifest (the step
    /// commits once every rank's part is there).
    Promoted,
    /// Not promoted: the save of step `by` took its place in a full queue.
    Superseded {
        /// The step whose promotion replaced this one.
        by: u64,
    },
    /// Not promoted: the policy promotes only multiples of [`Promotion::multiple_of`].
    NotChosen,
    /// The promotion failed. Nothing of it became complete on the durable tier, but for a
    /// rank's part whose commit failed after its manifest was written; what it left there is
    /// [`Checkpoints::gc`](crate::Checkpoints::gc)'s. (A step the durable tier held already, with other bytes, fails
    /// with [`ErrorKind::AlreadyExists`] and stays as it was.)
    Failed {
        /// The failure's kind.
        kind: ErrorKind,
        /// What failed, as the error says it.
        message: String,
    },
}
