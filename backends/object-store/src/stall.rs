//! Stall detection: a request is cut, and retried by object_store, once it has gone several
//! times longer than this store's answers have been taking, with a floor, rather than when the
//! fixed request timeout (object_store's `timeout`, 30 s unless set) runs out.
//!
//! A held response (the server took the request and sends nothing), a body that stops half
//! way and a body that trickles in a few bytes a second all cost the whole timeout otherwise:
//! through a proxy holding 8% of responses, a 192 MiB copy up took 49 times as long as a clean
//! one. A fixed timeout cannot be both short and safe, since a 64 MiB part at a slow link takes
//! seconds; so what a request may take follows from its size and what the store has been
//! doing, as the AWS Common Runtime's S3 client cuts connections whose throughput stays under a
//! minimum for a short interval:
//!
//! - **Waiting for the answer.** A request without a body may wait `factor` times the store's
//!   recent time to first byte (its 90th percentile over the last 64 answers); one with a body
//!   (an upload's part) that, plus its length at the store's recent upload rate (the 10th
//!   percentile); never less than `floor`. Until the store has answered once, a request
//!   without a body may wait 5 floors (10 s by default), one with a body is not cut (the
//!   request timeout still is); a waiting request's allowance is worked out again as answers
//!   come in, so the first parts of a save are cut soon after their peers finish.
//! - **Reading an object's body** (a GET of its bytes, which object_store resumes from the
//!   last byte received), or the answer to starting a multipart upload (whose loss the sink
//!   handles). A body that brings no bytes for the waiting allowance of a request
//!   without a body, or fewer than `min_body_rate` bytes a second over `floor`, is cut. Only
//!   time the reader spent waiting for bytes counts: a consumer that stops reading is not a
//!   stalled store.
//!
//! - **Hedged reads.** A ranged GET whose answer has not begun by the 95th percentile of the
//!   store's recent ranged GETs is sent a second time, and whichever answers first is read
//!   ("The Tail at Scale", Dean and Barroso). At most `hedged_reads_percent` (5) in a hundred
//!   ranged GETs are sent twice; both copies carry the same ETag condition.
//!
//! - **Slow is not stalled.** A request cut while it waited may wait twice as long on each
//!   try after (its method, address and range name it), so a store that answers every such
//!   request late but does answer (moto reads a whole object for every ranged GET of it: a GET
//!   of 8 MiB of a 512 MiB object waits seconds) is answered on a later try, and its late
//!   answers then teach the store's figures what to expect. Without that, every try of such a
//!   request was cut at the same allowance, which the store's fast answers to small requests
//!   kept low, and the read failed.
//!
//! Only requests that are tried again after a timeout are cut while they wait: reads,
//! unconditional PUTs (objects, parts, blocks, copies), starting a multipart upload
//! (object_store repeats all of these), and deletes (which this crate sends again).
//! Conditional writes (create-new's `If-None-Match`), which nobody repeats, wait for the
//! request timeout as before, and so does completing a multipart upload, whose wait grows
//! with the object's size and whose cut can lose the save on some stores (see
//! `retried_once_cut`).
//!
//! A cut request fails with a timeout, which object_store retries: an upload's part from its
//! buffer, a download from the last byte received (pinned to the object's ETag), and the error
//! once the retries run out says "no bytes for N s" and the key and part (see
//! `DURABILITY.md`).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use object_store::client::{HttpError, HttpErrorKind, HttpResponseBody};

use crate::options::StallDetection;

/// Answers each figure is taken over.
const SAMPLES: usize = 64;
/// Requests remembered as cut, at most; past it the memory starts over (a retry then waits the
/// plain allowance again, which is safe, only slower to learn).
const REMEMBERED_CUTS: usize = 4096;
/// Request bodies shorter than this count as none: their wait is all time to first byte.
const SMALL_BODY: usize = 64 << 10;
/// Request bodies at least this long measure the upload rate; shorter ones are mostly latency.
const RATE_SAMPLE_MIN: u64 = 1 << 20;
/// How often a waiting request's allowance is worked out again.
const TICK: Duration = Duration::from_millis(100);
/// Before the store has answered anything, a request with no body to send may wait this many
/// floors (10 s by default): a cold connection's DNS, TLS and first answer take well under
/// that on any store, and a command line tool's first request (a listing) would otherwise
/// wait out the whole request timeout when it is held.
const BEFORE_ANY_ANSWER: u32 = 5;

/// The most recent figures of one kind.
#[derive(Debug, Default)]
struct Samples(VecDeque<f64>);

impl Samples {
    fn push(&mut self, value: f64) {
        if self.0.len() == SAMPLES {
            self.0.pop_front();
        }
        self.0.push_back(value);
    }

    /// The `q` quantile (0 to 1), by the nearest rank.
    fn quantile(&self, q: f64) -> Option<f64> {
        let mut sorted: Vec<f64> = self.0.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        let last = sorted.len().checked_sub(1)?;
        sorted.get((last as f64 * q).round() as usize).copied()
    }
}

/// What the store's answers have taken lately.
#[derive(Debug, Default)]
struct Figures {
    /// Seconds from a request without a body to its answer's first byte.
    first_byte: Samples,
    /// The same, of ranged GETs alone: what a hedged read waits for.
    ranged_first_byte: Samples,
    /// Bytes a second of requests with a body, sent and answered.
    upload_rate: Samples,
    /// Ranged GETs sent, and how many of them were sent a second time.
    ranged: u64,
    hedged: u64,
}

/// What stall detection has done, for reports and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StallCounts {
    /// Requests cut while waiting for their answer.
    pub cut_waiting: u64,
    /// Answers cut while their body had stopped or slowed to a trickle.
    pub cut_in_body: u64,
    /// Ranged GETs sent.
    pub ranged_reads: u64,
    /// Ranged GETs sent a second time (hedged).
    pub hedged: u64,
    /// Hedged GETs whose second copy answered first.
    pub hedges_won: u64,
}

impl StallCounts {
    /// Requests cut either way.
    pub fn cut(&self) -> u64 {
        self.cut_waiting + self.cut_in_body
    }
}

/// The stall detection of one opened store: its settings, what its answers have taken, and
/// what it cut. [`open_url`](crate::open_url) builds one into every cloud store's HTTP client
/// ([`http_connector`](crate::http_connector)), and
/// [`ObjectStorage::stall_watch`](crate::ObjectStorage::stall_watch) reports it.
#[derive(Debug)]
pub struct StallWatch {
    settings: Mutex<Option<StallDetection>>,
    figures: Mutex<Figures>,
    cut_waiting: AtomicU64,
    cut_in_body: AtomicU64,
    hedges_won: AtomicU64,
    /// How many times each request (by [`retry_identity`](crate::http_client)) was cut while
    /// it waited and not answered since: each doubles what its next try may wait.
    cuts: Mutex<HashMap<String, u32>>,
}

impl StallWatch {
    /// A watch with these settings (`None`: off) and no figures yet.
    pub fn new(settings: Option<StallDetection>) -> Self {
        Self {
            settings: Mutex::new(settings),
            figures: Mutex::default(),
            cut_waiting: AtomicU64::new(0),
            cut_in_body: AtomicU64::new(0),
            hedges_won: AtomicU64::new(0),
            cuts: Mutex::default(),
        }
    }

    /// What it has cut so far.
    pub fn counts(&self) -> StallCounts {
        let figures = self.figures();
        StallCounts {
            cut_waiting: self.cut_waiting.load(Ordering::Relaxed),
            cut_in_body: self.cut_in_body.load(Ordering::Relaxed),
            ranged_reads: figures.ranged,
            hedged: figures.hedged,
            hedges_won: self.hedges_won.load(Ordering::Relaxed),
        }
    }

    /// The settings in force (`None`: off).
    pub fn settings(&self) -> Option<StallDetection> {
        *self.settings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets them, for every request from now on.
    pub(crate) fn set(&self, settings: Option<StallDetection>) {
        *self.settings.lock().unwrap_or_else(PoisonError::into_inner) = settings;
    }

    fn figures(&self) -> std::sync::MutexGuard<'_, Figures> {
        self.figures.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How long a request with a body of `body_len` bytes may wait for its answer, and what
    /// was expected of it; `None` while detection is off, or for a request with a body while
    /// the store has not answered yet (no upload rate is known).
    fn waiting_allowance(&self, body_len: usize) -> Option<(Duration, Duration)> {
        let settings = self.settings()?;
        let figures = self.figures();
        let Some(first_byte) = figures.first_byte.quantile(0.9) else {
            return (body_len < SMALL_BODY)
                .then(|| (settings.floor * BEFORE_ANY_ANSWER, settings.floor));
        };
        let sending = if body_len < SMALL_BODY {
            0.0
        } else {
            body_len as f64 / figures.upload_rate.quantile(0.1)?
        };
        let expected = Duration::from_secs_f64(first_byte + sending);
        Some(((expected * settings.factor).max(settings.floor), expected))
    }

    fn cuts(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.cuts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Resolves, with the error to fail it with, once the request `identity` (see the module
    /// docs), sent at `started` with a body of `body_len` bytes, has waited past its allowance,
    /// doubled for each time it was cut before; never while detection is off.
    pub(crate) async fn stalled_waiting(
        &self,
        identity: &str,
        started: Instant,
        body_len: usize,
    ) -> HttpError {
        let (earlier, widen) = self.widening(identity);
        loop {
            tokio::time::sleep(TICK).await;
            let Some((allowed, expected)) = self.waiting_allowance(body_len) else {
                continue;
            };
            let waited = started.elapsed();
            if waited > allowed * widen {
                self.cut_waiting.fetch_add(1, Ordering::Relaxed);
                self.note_cut(identity);
                return stalled(format!(
                    "no bytes for {:.1} s after the request{}, where {:.1} s was expected{}",
                    waited.as_secs_f64(),
                    if body_len < SMALL_BODY {
                        String::new()
                    } else {
                        format!(" and its {body_len} bytes")
                    },
                    expected.as_secs_f64(),
                    if earlier == 0 {
                        String::new()
                    } else {
                        format!(
                            " (this try waited {widen} times that allowance: it was cut {earlier} times before)"
                        )
                    }
                ));
            }
        }
    }

    /// How many times the request `identity` was cut since it was last answered, and what its
    /// allowance is multiplied by for that: 2 to that power (at most 2^16, past any request
    /// timeout, which stays the ceiling).
    fn widening(&self, identity: &str) -> (u32, u32) {
        let earlier = self.cuts().get(identity).copied().unwrap_or(0);
        (earlier, 1 << earlier.min(16))
    }

    /// Remembers that the request `identity` was cut while it waited.
    fn note_cut(&self, identity: &str) {
        let mut cuts = self.cuts();
        if cuts.len() >= REMEMBERED_CUTS {
            cuts.clear();
        }
        *cuts.entry(identity.to_owned()).or_default() += 1;
    }

    /// Forgets that the request `identity` was cut: it was answered.
    pub(crate) fn answered(&self, identity: &str) {
        let mut cuts = self.cuts();
        if !cuts.is_empty() {
            cuts.remove(identity);
        }
    }

    /// Learns from an answer that came `waited` after a request with a body of `body_len`
    /// (a ranged GET: `ranged`).
    pub(crate) fn observe_answer(&self, waited: Duration, body_len: usize, ranged: bool) {
        let mut figures = self.figures();
        let seconds = waited.as_secs_f64().max(1e-6);
        if ranged {
            figures.ranged_first_byte.push(seconds);
        }
        if body_len < SMALL_BODY {
            figures.first_byte.push(seconds);
        } else if body_len as u64 >= RATE_SAMPLE_MIN {
            figures.upload_rate.push(body_len as f64 / seconds);
        }
    }

    /// Counts a ranged GET, and says how long it may wait for its first byte before it is
    /// sent again: `None` while hedging is off or the store's GETs are not known yet.
    pub(crate) fn hedge_after(&self) -> Option<Duration> {
        let percent = self.settings()?.hedged_reads_percent;
        let mut figures = self.figures();
        figures.ranged += 1;
        if percent == 0 {
            return None;
        }
        figures
            .ranged_first_byte
            .quantile(0.95)
            .map(Duration::from_secs_f64)
    }

    /// Takes one hedge from the budget (the percentage of ranged GETs), if one is left.
    pub(crate) fn take_hedge(&self) -> bool {
        let percent = self.settings().map_or(0, |s| s.hedged_reads_percent);
        let mut figures = self.figures();
        let allowed = figures.ranged * u64::from(percent) / 100;
        if figures.hedged < allowed {
            figures.hedged += 1;
            true
        } else {
            false
        }
    }

    /// Counts a hedge whose second copy answered first.
    pub(crate) fn hedge_won(&self) {
        self.hedges_won.fetch_add(1, Ordering::Relaxed);
    }

    /// `body` cut if it stalls, as the module docs say.
    pub(crate) fn watch_body(self: &Arc<Self>, body: HttpResponseBody) -> HttpResponseBody {
        HttpResponseBody::new(WatchedBody {
            inner: body,
            watch: Arc::clone(self),
            waiting_since: None,
            window_waited: Duration::ZERO,
            window_bytes: 0,
            timer: None,
            failed: false,
        })
    }

    /// What a body may do: go without bytes this long, and bring at least this many bytes a
    /// second over windows of this much waiting.
    fn body_allowance(&self) -> Option<(Duration, f64, Duration)> {
        let settings = self.settings()?;
        let first_byte = self.figures().first_byte.quantile(0.9).unwrap_or(0.0);
        let gap = Duration::from_secs_f64(first_byte * f64::from(settings.factor));
        Some((
            gap.max(settings.floor),
            settings.min_body_rate as f64,
            settings.floor,
        ))
    }
}

/// Why stall detection cut a request, as the source of the timeout it fails with.
#[derive(Debug)]
pub(crate) struct Stalled(String);

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Stalled {}

/// The error a cut request fails with: a timeout, which object_store retries.
fn stalled(message: String) -> HttpError {
    HttpError::new(HttpErrorKind::Timeout, Stalled(message))
}

/// A response body under watch; see the module docs.
#[derive(Debug)]
struct WatchedBody {
    inner: HttpResponseBody,
    watch: Arc<StallWatch>,
    /// Since when the reader has been waiting for the next bytes.
    waiting_since: Option<Instant>,
    /// Waiting, and bytes, in the current rate window.
    window_waited: Duration,
    window_bytes: u64,
    /// Wakes the reader to look again while it waits.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    failed: bool,
}

impl WatchedBody {
    /// The error to fail with, if the body has stalled by now; closes the rate window once it
    /// has run its length.
    fn check(&mut self, now: Instant) -> Option<HttpError> {
        let (gap, min_rate, window) = self.watch.body_allowance()?;
        let waiting = self
            .waiting_since
            .map_or(Duration::ZERO, |since| now - since);
        let waited = self.window_waited + waiting;
        let message = if waiting > gap {
            format!(
                "no bytes for {:.1} s in the middle of the answer",
                waiting.as_secs_f64()
            )
        } else if waited >= window {
            let rate = self.window_bytes as f64 / waited.as_secs_f64();
            if rate >= min_rate {
                (self.window_waited, self.window_bytes) = (Duration::ZERO, 0);
                self.waiting_since = self.waiting_since.map(|_| now);
                return None;
            }
            format!(
                "the answer's bytes came at {rate:.0} bytes a second over {:.1} s of waiting, \
                 under the {min_rate:.0} stall detection allows",
                waited.as_secs_f64()
            )
        } else {
            return None;
        };
        self.watch.cut_in_body.fetch_add(1, Ordering::Relaxed);
        self.failed = true;
        Some(stalled(message))
    }
}

impl Body for WatchedBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        let now = Instant::now();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some(since) = this.waiting_since.take() {
                    this.window_waited += now - since;
                }
                if let Some(Ok(data)) = frame.as_ref().map(|f| f.as_ref().map(Frame::data_ref)) {
                    this.window_bytes += data.map_or(0, |d| d.len() as u64);
                }
                match this.check(now) {
                    Some(error) => Poll::Ready(Some(Err(error))),
                    None => Poll::Ready(frame),
                }
            }
            Poll::Pending => {
                this.waiting_since.get_or_insert(now);
                if let Some(error) = this.check(now) {
                    return Poll::Ready(Some(Err(error)));
                }
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(TICK)));
                timer.as_mut().reset((now + TICK).into());
                // Registers the wake-up; a deadline just set ahead has not passed yet.
                let _ = timer.as_mut().poll(cx);
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use http_body_util::{BodyExt, StreamBody};

    use super::*;

    fn watch(floor_ms: u64) -> Arc<StallWatch> {
        let settings = StallDetection::DEFAULT
            .with_floor(Duration::from_millis(floor_ms))
            .with_min_body_rate(1024);
        Arc::new(StallWatch::new(Some(settings)))
    }

    #[test]
    fn quantiles_take_the_nearest_rank_of_the_last_samples() {
        let mut samples = Samples::default();
        assert_eq!(samples.quantile(0.9), None);
        for value in 0..100 {
            samples.push(f64::from(value));
        }
        // The last 64: 36 to 99.
        assert_eq!(samples.quantile(0.0), Some(36.0));
        assert_eq!(samples.quantile(1.0), Some(99.0));
        assert_eq!(samples.quantile(0.9), Some(93.0));
    }

    #[test]
    fn a_waiting_request_gets_factor_times_what_is_expected_and_at_least_the_floor() {
        let watch = watch(1000);
        assert_eq!(
            watch.waiting_allowance(0),
            Some((Duration::from_secs(5), Duration::from_secs(1))),
            "nothing answered yet: five floors"
        );
        assert_eq!(
            watch.waiting_allowance(8 << 20),
            None,
            "nothing answered yet: a body's sending time is unknown"
        );
        watch.observe_answer(Duration::from_millis(100), 0, false);
        let (allowed, expected) = watch.waiting_allowance(0).expect("a first byte seen");
        assert_eq!(expected, Duration::from_millis(100));
        assert_eq!(allowed, Duration::from_secs(1), "the floor");
        assert_eq!(
            watch.waiting_allowance(8 << 20),
            None,
            "no upload seen: a body's sending time is unknown"
        );
        // 8 MiB answered after a second: 8 MiB/s.
        watch.observe_answer(Duration::from_secs(1), 8 << 20, false);
        let (allowed, expected) = watch.waiting_allowance(16 << 20).expect("an upload seen");
        assert_eq!(expected, Duration::from_millis(2100));
        assert_eq!(allowed, Duration::from_millis(8400));
        watch.set(None);
        assert_eq!(watch.waiting_allowance(0), None, "turned off");
    }

    #[tokio::test]
    async fn each_cut_doubles_what_the_next_try_of_that_request_may_wait() {
        let watch = watch(50);
        watch.observe_answer(Duration::from_millis(1), 0, false);
        let (a, b) = ("GET /a bytes=0-9", "GET /a bytes=10-19");
        assert_eq!(watch.widening(a), (0, 1));
        watch.note_cut(a);
        watch.note_cut(a);
        assert_eq!(
            watch.widening(a),
            (2, 4),
            "two cuts: four times the allowance"
        );
        assert_eq!(
            watch.widening(b),
            (0, 1),
            "another range is another request"
        );
        watch.answered(a);
        assert_eq!(watch.widening(a), (0, 1), "an answer forgets the cuts");
        // A cut says how long its try was allowed and why.
        watch.note_cut(a);
        let said = watch
            .stalled_waiting(a, Instant::now(), 0)
            .await
            .to_string();
        assert!(said.contains("waited 2 times that allowance"), "{said}");
        assert!(said.contains("cut 1 times before"), "{said}");
        assert_eq!(watch.widening(a), (2, 4), "the cut is remembered");
    }

    /// Reads `body` to its end or its first error, pausing `pause` after the first frame.
    async fn read(body: HttpResponseBody, pause: Duration) -> Result<Vec<u8>, String> {
        let mut body = body;
        let mut bytes = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                format!(
                    "{e}: {}",
                    std::error::Error::source(&e)
                        .map(ToString::to_string)
                        .unwrap_or_default()
                )
            })?;
            if bytes.is_empty() {
                tokio::time::sleep(pause).await;
            }
            bytes.extend_from_slice(frame.data_ref().map_or(&[][..], |d| &d[..]));
        }
        Ok(bytes)
    }

    fn frame(bytes: &'static [u8]) -> Result<Frame<Bytes>, HttpError> {
        Ok(Frame::data(Bytes::from_static(bytes)))
    }

    #[tokio::test]
    async fn a_body_that_stops_is_cut_after_the_floor() {
        let watch = watch(200);
        let stream = futures::stream::iter([frame(b"half")]).chain(futures::stream::pending());
        let body = watch.watch_body(HttpResponseBody::new(StreamBody::new(stream)));
        let error = read(body, Duration::ZERO).await.expect_err("cut");
        assert!(error.contains("no bytes for"), "{error}");
        assert_eq!(watch.counts().cut_in_body, 1);
    }

    #[tokio::test]
    async fn a_trickling_body_is_cut_and_a_paused_reader_is_not() {
        let watch = watch(200);
        let drip = futures::stream::iter(0..100).then(|_| async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            frame(b"x")
        });
        let body = watch.watch_body(HttpResponseBody::new(StreamBody::new(drip)));
        let error = read(body, Duration::ZERO).await.expect_err("cut");
        assert!(error.contains("bytes a second"), "{error}");
        assert_eq!(watch.counts().cut_in_body, 1);
        // A reader that stops reading for longer than the floor: the bytes were there.
        let body = futures::stream::iter([frame(b"first"), frame(b"second")]);
        let body = watch.watch_body(HttpResponseBody::new(StreamBody::new(body)));
        let bytes = read(body, Duration::from_millis(500))
            .await
            .expect("not cut");
        assert_eq!(bytes, b"firstsecond");
        assert_eq!(watch.counts().cut_in_body, 1);
    }
}
