//! What the kill tests share.

/// A small xorshift generator: the victims and kill moments, reproducible from the printed
/// seed (`WEIGHTBAY_KILL_SEED` replays them).
pub(crate) struct Moments(u64);

impl Moments {
    /// Seeded by `WEIGHTBAY_KILL_SEED`, or else by this process's id; the seed is printed.
    pub(crate) fn from_env() -> Self {
        let seed = std::env::var("WEIGHTBAY_KILL_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| u64::from(std::process::id()) | 1);
        eprintln!("kill moments from seed {seed} (WEIGHTBAY_KILL_SEED replays them)");
        Self(seed)
    }

    /// The next number below `below` (at least 1).
    pub(crate) fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below.max(1)
    }
}
