//! Tuning an [`ObjectStorage`](crate::ObjectStorage): part sizes, parts in flight, the fetch
//! budget, what counts as a dead writer's upload, and how long a write may take.

use std::time::Duration;

/// The smallest part S3 and GCS accept (except the last).
pub const MIN_PART_SIZE: usize = 5 * 1024 * 1024;
/// The most parts one multipart upload may have.
pub const MAX_PARTS: u64 = 10_000;
/// Staged uploads for create-new live under this first key segment, which user keys may not
/// use.
pub const STAGING_DIR: &str = ".weightbay-staging";

/// Tuning for an [`ObjectStorage`](crate::ObjectStorage): [`ObjectStoreOptions::DEFAULT`] and the
/// `with_` setters (usable in a `const`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ObjectStoreOptions {
    /// The smallest part size, raised for large containers so they fit in 10,000 parts.
    /// Default 8 MiB. S3 and GCS refuse parts under [`MIN_PART_SIZE`] (except the last);
    /// in-memory and local stores take any size.
    pub part_size: usize,
    /// Parts uploading at once; the writer blocks when this many are in flight. Default 8.
    pub parts_in_flight: usize,
    /// Whether a completed upload survives power loss. Default false; [`open_url`](crate::open_url)
    /// sets it for S3, GCS and Azure.
    pub durable: bool,
    /// Bytes [`ObjectSource::fetch`](crate::ObjectSource::fetch) keeps in flight at once. Default
    /// 256 MiB.
    pub fetch_budget: usize,
    /// The largest request [`ObjectSource::fetch`](crate::ObjectSource::fetch) makes (coalesced
    /// ranges up to this long, a longer tensor in pieces this long), or `None` for one request per
    /// run of adjacent ranges (what `object_store`'s `get_ranges` makes).
    ///
    /// Default 16 MiB: a cloud store caps what one connection carries, so a load runs as many
    /// parallel ranged GETs as the budget allows. Measured against a store with 20 ms to first byte
    /// and 100 MiB/s per connection (docs/BENCHMARKS.md, "remote" rows), 16 MiB requests within the
    /// default budget (16 in flight) load 3.4× faster than 64 MiB ones (4 in flight), and smaller
    /// requests lose more to latency than they gain. [`open_url`](crate::open_url) picks `None` for
    /// stores on this machine (`memory://`, `file://`, an endpoint on loopback such as moto, MinIO
    /// or LocalStack), where there is no per-connection limit to spread over and every extra
    /// request is work for the same cores; some emulators (moto) even read the whole object for
    /// each ranged GET.
    pub fetch_request_len: Option<u64>,
    /// A staged create-new upload, or the journal of a multipart upload whose writer runs on
    /// another machine, that is older than this is a dead writer's, for
    /// [`Storage::clean_pending`](weightbay::Storage::clean_pending) to remove. A writer
    /// renews its journal every half of this while it uploads (at most once a second). Default
    /// one hour.
    pub stale_after: Duration,
    /// How long any one write may take, start to commit, when its
    /// [`CreateOptions::deadline`](weightbay::CreateOptions::deadline) sets none: past it the
    /// request in flight is cut, the upload aborted, and the write fails with
    /// [`ErrorKind::TimedOut`](weightbay::ErrorKind::TimedOut) naming the key and the part.
    /// Default `None`: a write ends when its requests do (each retried as object_store's
    /// `RetryConfig` says).
    pub save_timeout: Option<Duration>,
    /// How requests that stopped are found and cut before the request timeout (see
    /// [`StallWatch`](crate::StallWatch)); `None` turns it off. Default
    /// [`StallDetection::DEFAULT`]. Applies to the stores [`open_url`](crate::open_url) builds
    /// (S3, GCS, Azure), whose HTTP client it watches.
    pub stall_detection: Option<StallDetection>,
}

/// How [stall detection](crate::StallWatch) judges a request, and how many reads it hedges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StallDetection {
    /// No request is cut sooner than this, and a body's rate is judged over this much waiting.
    /// Default 2 s.
    pub floor: Duration,
    /// A request may take this many times what the store's recent answers lead to expect.
    /// Default 4.
    pub factor: u32,
    /// The slowest a body may come, in bytes a second over [`floor`](Self::floor) of waiting,
    /// before it counts as a trickle. Default 256 KiB/s (2 Mbit/s): far under any link a
    /// checkpoint crosses, far over a stalled server's drip.
    pub min_body_rate: u64,
    /// Hedged reads: a ranged GET whose answer has not begun once the store's recent GETs had
    /// (their 95th percentile of time to first byte) is sent a second time, and the first
    /// answer is taken, the other dropped. At most this many in a hundred ranged GETs are
    /// sent twice; 0 turns hedging off. Both copies carry the same ETag condition, so they
    /// read the same bytes. Default 5.
    pub hedged_reads_percent: u32,
}

impl StallDetection {
    /// The defaults each field documents.
    pub const DEFAULT: Self = Self {
        floor: Duration::from_secs(2),
        factor: 4,
        min_body_rate: 256 * 1024,
        hedged_reads_percent: 5,
    };

    /// Sets [`floor`](Self::floor).
    #[must_use]
    pub const fn with_floor(mut self, floor: Duration) -> Self {
        self.floor = floor;
        self
    }

    /// Sets [`factor`](Self::factor).
    #[must_use]
    pub const fn with_factor(mut self, factor: u32) -> Self {
        self.factor = factor;
        self
    }

    /// Sets [`hedged_reads_percent`](Self::hedged_reads_percent).
    #[must_use]
    pub const fn with_hedged_reads_percent(mut self, percent: u32) -> Self {
        self.hedged_reads_percent = percent;
        self
    }

    /// Sets [`min_body_rate`](Self::min_body_rate).
    #[must_use]
    pub const fn with_min_body_rate(mut self, bytes_per_second: u64) -> Self {
        self.min_body_rate = bytes_per_second;
        self
    }
}

impl Default for StallDetection {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl Default for ObjectStoreOptions {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl ObjectStoreOptions {
    /// The defaults each field documents.
    pub const DEFAULT: Self = Self {
        part_size: 8 * 1024 * 1024,
        parts_in_flight: 8,
        durable: false,
        fetch_budget: 256 * 1024 * 1024,
        fetch_request_len: Some(16 * 1024 * 1024),
        stale_after: Duration::from_secs(3600),
        save_timeout: None,
        stall_detection: Some(StallDetection::DEFAULT),
    };

    /// Sets [`part_size`](Self::part_size).
    #[must_use]
    pub const fn with_part_size(mut self, part_size: usize) -> Self {
        self.part_size = part_size;
        self
    }

    /// Sets [`parts_in_flight`](Self::parts_in_flight).
    #[must_use]
    pub const fn with_parts_in_flight(mut self, parts: usize) -> Self {
        self.parts_in_flight = parts;
        self
    }

    /// Sets [`durable`](Self::durable).
    #[must_use]
    pub const fn with_durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// Sets [`fetch_budget`](Self::fetch_budget).
    #[must_use]
    pub const fn with_fetch_budget(mut self, bytes: usize) -> Self {
        self.fetch_budget = bytes;
        self
    }

    /// Sets [`fetch_request_len`](Self::fetch_request_len).
    #[must_use]
    pub const fn with_fetch_request_len(mut self, len: Option<u64>) -> Self {
        self.fetch_request_len = len;
        self
    }

    /// Sets [`stale_after`](Self::stale_after).
    #[must_use]
    pub const fn with_stale_after(mut self, age: Duration) -> Self {
        self.stale_after = age;
        self
    }

    /// Sets [`save_timeout`](Self::save_timeout).
    #[must_use]
    pub const fn with_save_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.save_timeout = timeout;
        self
    }

    /// Sets [`stall_detection`](Self::stall_detection).
    #[must_use]
    pub const fn with_stall_detection(mut self, stall_detection: Option<StallDetection>) -> Self {
        self.stall_detection = stall_detection;
        self
    }

    /// The part size for a container of `total_len` bytes (unknown: the configured size).
    ///
    /// The configured size, exactly, unless the container would then need more than
    /// [`MAX_PARTS`] parts; then the smallest whole number of MiB that fits it in them.
    pub fn part_size_for(&self, total_len: Option<u64>) -> usize {
        let configured = self.part_size.max(1);
        let needed = total_len.map_or(0, |len| len.div_ceil(MAX_PARTS));
        if needed <= configured as u64 {
            configured
        } else {
            usize::try_from(needed.next_multiple_of(1 << 20)).unwrap_or(usize::MAX)
        }
    }

    /// The most bytes a sink holds: one part filling plus the parts in flight.
    pub fn buffer_bound(&self, total_len: Option<u64>) -> u64 {
        self.part_size_for(total_len) as u64 * (self.parts_in_flight as u64 + 1)
    }
}
