//! A request rate that adapts to the store's answers, shared by every storage of one store in a
//! process: it halves when at least half of the last two seconds' answers (and at least 16 of
//! them) are 503 (S3's SlowDown) or 429, and grows back slowly while requests succeed
//! (additive increase, multiplicative decrease, as TCP shares a link). Throttled answers that
//! are a minority are left to object_store's retries: a store that sheds a share of requests
//! whatever the rate (as a busy partition does) would otherwise pace a job down to a crawl
//! (with the share at a third and four answers enough, a storm of 10% random 503s through the
//! fault proxy cut the pace seven times in 9 s, to 1.3 requests a second, and a save ran 2.9×
//! slower than without it).
//! Retrying alone does not help a throttled prefix: every client's retries land on it again.
//! Backing off together does, and since every process halves on its own throttled answers,
//! the ranks of a job converge on a share of what the prefix takes without talking to each
//! other.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// The lowest rate a throttle falls to, in requests per second: a store that throttles even
/// this is retried by object_store's backoff alone.
const MIN_RATE: f64 = 1.0;
/// How much the rate grows per successful request, as a share of a request per second: at
/// `r` requests per second it grows by 2% a second.
const GROWTH: f64 = 0.02;
/// Over this rate the throttle stops pacing (as if it had never been throttled).
const UNPACED: f64 = 100_000.0;
/// The share of throttled answers in the last [`ANSWER_WINDOW`] at which the rate is cut.
const CUT_SHARE: f64 = 0.5;
/// Fewer answers than this in the window never cut the rate: at 10% random 503s, 8 or more
/// of 16 come about once in 25,000 windows.
const CUT_MIN_ANSWERS: usize = 16;
/// How far back answers count for a cut.
const ANSWER_WINDOW: Duration = Duration::from_secs(2);
/// How far back sends count for the rate a first cut halves.
const RATE_WINDOW: Duration = Duration::from_secs(1);

/// What a throttle has seen, for reports and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ThrottleCounts {
    /// Requests sent through it.
    pub requests: u64,
    /// Answers of 503 or 429.
    pub throttled: u64,
    /// Times the rate was halved (throttled answers to requests sent before the last cut do
    /// not cut again).
    pub cuts: u64,
    /// The pace now, in requests per second; `None` when unpaced.
    pub rate: Option<f64>,
    /// The lowest pace it fell to.
    pub lowest_rate: Option<f64>,
}

#[derive(Debug, Default)]
struct Pace {
    /// Requests per second, once throttled.
    rate: Option<f64>,
    /// When the next request may go.
    next: Option<Instant>,
    /// When the rate was last cut.
    last_cut: Option<Instant>,
    /// Send times in the last second, to know the rate to halve the first time.
    recent: VecDeque<Instant>,
    /// Answers in the last second: when, and whether throttled.
    answers: VecDeque<(Instant, bool)>,
    counts: ThrottleCounts,
}

/// The adaptive request rate of one store; see the module docs.
#[derive(Debug, Default)]
pub struct Throttle {
    pace: Mutex<Pace>,
}

impl Throttle {
    /// The throttle every storage of the store named `store` shares in this process (the
    /// name is the scheme, bucket and endpoint, as [`open_url`](crate::open_url) makes it).
    pub fn shared(store: &str) -> Arc<Self> {
        static ALL: OnceLock<Mutex<HashMap<String, Arc<Throttle>>>> = OnceLock::new();
        let mut all = ALL
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Arc::clone(all.entry(store.to_owned()).or_default())
    }

    /// What it has seen so far.
    pub fn counts(&self) -> ThrottleCounts {
        self.lock().counts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pace> {
        self.pace.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a request's turn at the current pace and returns when it went: what an HTTP
    /// client of its own does before each request ([`http_connector`](crate::http_connector)'s
    /// client does it for object_store's). Report the answer with [`observe`](Self::observe).
    pub async fn pace(&self) -> Instant {
        tokio::time::sleep_until(self.slot().into()).await;
        Instant::now()
    }

    /// When the next request may go, taking its slot.
    fn slot(&self) -> Instant {
        let now = Instant::now();
        let mut pace = self.lock();
        pace.counts.requests += 1;
        while pace.recent.front().is_some_and(|t| now - *t > RATE_WINDOW) {
            pace.recent.pop_front();
        }
        pace.recent.push_back(now);
        let Some(rate) = pace.rate else {
            return now;
        };
        let slot = pace.next.map_or(now, |next| next.max(now));
        pace.next = Some(slot + Duration::from_secs_f64(1.0 / rate));
        slot
    }

    /// Learns from the answer (its HTTP status; `None` when none came) to a request that went
    /// at `sent`, as [`pace`](Self::pace) returned it.
    pub fn observe(&self, sent: Instant, status: Option<u16>) {
        let now = Instant::now();
        let mut pace = self.lock();
        let throttled = matches!(status, Some(503 | 429));
        while pace
            .answers
            .front()
            .is_some_and(|(t, _)| now - *t > ANSWER_WINDOW)
        {
            pace.answers.pop_front();
        }
        pace.answers.push_back((now, throttled));
        match status {
            Some(503 | 429) => {
                pace.counts.throttled += 1;
                let recent = pace.answers.len();
                let share = pace.answers.iter().filter(|(_, t)| *t).count() as f64 / recent as f64;
                // Sent before the last cut: the cut already answered it.
                let answered = pace.last_cut.is_some_and(|cut| sent < cut);
                if answered || recent < CUT_MIN_ANSWERS || share < CUT_SHARE {
                    return;
                }
                let sending = pace.recent.len() as f64;
                let rate = (pace.rate.unwrap_or(sending) / 2.0).max(MIN_RATE);
                pace.rate = Some(rate);
                pace.last_cut = Some(now);
                // The next cut answers what the new rate gets, not what the old one got.
                pace.answers.clear();
                pace.counts.cuts += 1;
                pace.counts.rate = Some(rate);
                pace.counts.lowest_rate =
                    Some(pace.counts.lowest_rate.map_or(rate, |r| r.min(rate)));
            }
            Some(status) if status < 500 => {
                if let Some(rate) = pace.rate {
                    let grown = rate + GROWTH;
                    pace.rate = (grown < UNPACED).then_some(grown);
                    pace.counts.rate = pace.rate;
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(throttle: &Throttle, statuses: &[u16]) {
        for &status in statuses {
            let sent = Instant::now();
            throttle.slot();
            throttle.observe(sent, Some(status));
        }
    }

    #[test]
    fn a_minority_of_throttled_answers_leaves_the_pace_alone() {
        let throttle = Throttle::default();
        // A tenth throttled, with bursts of three in a row, and half of the first four.
        let mut statuses = vec![200, 503, 200, 503];
        for round in 0..100 {
            statuses.extend([200; 7]);
            statuses.extend(if round % 10 == 0 {
                [503, 429, 503]
            } else {
                [200, 200, 503]
            });
        }
        answer(&throttle, &statuses);
        let counts = throttle.counts();
        assert_eq!((counts.cuts, counts.rate), (0, None), "{counts:?}");
        assert_eq!(counts.throttled, 122);
    }

    #[test]
    fn mostly_throttled_answers_halve_the_pace_once_per_round() {
        let throttle = Throttle::default();
        answer(&throttle, &[200; 4]);
        answer(&throttle, &[503; 40]);
        let counts = throttle.counts();
        // Cut at the 16th answer (12 of them throttled; 16 sends in the last second, so to 8 a
        // second), then again once 16 answers of its own came back throttled.
        assert_eq!(counts.cuts, 2, "{counts:?}");
        assert_eq!(counts.lowest_rate, Some(4.0), "{counts:?}");
        answer(&throttle, &[200; 50]);
        assert!(
            throttle.counts().rate > Some(4.5),
            "{:?}",
            throttle.counts()
        );
    }
}
