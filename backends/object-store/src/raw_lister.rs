//! What a cloud store lists that `object_store` does not ask, or cannot parse, through
//! requests authorized with the store's own credentials and sent through the store's own
//! connector (so paced by its throttle and watched for stalls), and tried again as the store's
//! retry policy says:
//! - the multipart uploads open at a key (S3's ListMultipartUploads), for a journal whose
//!   writer died after the store created its upload and before the id was recorded (a window
//!   of one request);
//! - the objects under a prefix (S3's and GCS's ListObjectsV2, Azure's List Blobs) when one of
//!   their keys is no valid `object_store` path (a `.`, `..` or empty segment, as in
//!   `runs/a/step-1/../../x`, which anyone with write access can create): `object_store`
//!   fails the whole page it is in, so one planted object would make every listing of the
//!   prefix fail.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use object_store::client::{HttpClient, HttpConnector, HttpRequestBody};
use object_store::path::Path;
use object_store::signer::{Method, SignedUrlOptions, Signer};
use object_store::{ClientOptions, ObjectMeta, RetryConfig};

/// How long a presigned listing request stays valid.
const VALID_FOR: Duration = Duration::from_secs(300);

/// The most pages one listing of objects follows: 10 million keys at 1,000 a page (S3, GCS
/// and Azure alike), so a server that hands out continuation tokens without end cannot hold
/// a listing forever.
const MAX_PAGES: usize = 10_000;

/// Lists what `object_store` does not, on one bucket or container.
#[derive(Debug)]
pub(crate) struct RawLister {
    service: Service,
    client: HttpClient,
    /// The store's retry policy, which a request that fails in transport (reset, timed out,
    /// cut as stalled) or with a status a busy store answers (429, 5xx) follows.
    retry: RetryConfig,
}

/// How a lister sends its requests: through the store's connector, by the store's retry
/// policy.
pub(crate) type Sending<'a> = (&'a dyn HttpConnector, &'a RetryConfig);

/// Where a lister's requests go, and how they are authorized: as the store authorizes its
/// own.
#[derive(Debug)]
enum Service {
    /// An S3 bucket: each request presigned by the store.
    S3(Arc<dyn Signer>),
    /// A GCS bucket's XML API at `bucket_url`, with the store's bearer token (none where the
    /// store sends none).
    #[cfg(feature = "gcp")]
    Gcs {
        bucket_url: String,
        credentials: object_store::gcp::GcpCredentialProvider,
    },
    /// An Azure container at `container_url` of `account`, signed as the store signs (shared
    /// key, SAS or bearer token).
    #[cfg(feature = "azure")]
    Azure {
        container_url: String,
        account: String,
        credentials: object_store::azure::AzureCredentialProvider,
    },
}

/// The objects under a prefix, as the store lists them: those whose keys are valid paths,
/// and the keys of the others (which no container can have).
#[derive(Debug, Default)]
pub(crate) struct RawListing {
    pub(crate) objects: Vec<ObjectMeta>,
    pub(crate) unrepresentable: Vec<String>,
}

impl RawLister {
    /// A lister of the S3 bucket that `signer` (its store) presigns for.
    #[cfg_attr(not(feature = "aws"), allow(dead_code))]
    pub(crate) fn s3(signer: Arc<dyn Signer>, sending: Sending<'_>) -> object_store::Result<Self> {
        Self::new(Service::S3(signer), sending)
    }

    /// A lister of the GCS bucket at `bucket_url` (`{base URL}/{bucket}`), with the store's
    /// credentials.
    #[cfg(feature = "gcp")]
    pub(crate) fn gcs(
        bucket_url: String,
        credentials: object_store::gcp::GcpCredentialProvider,
        sending: Sending<'_>,
    ) -> object_store::Result<Self> {
        Self::new(
            Service::Gcs {
                bucket_url,
                credentials,
            },
            sending,
        )
    }

    /// A lister of the Azure container at `container_url` of `account`, with the store's
    /// credentials.
    #[cfg(feature = "azure")]
    pub(crate) fn azure(
        container_url: String,
        account: String,
        credentials: object_store::azure::AzureCredentialProvider,
        sending: Sending<'_>,
    ) -> object_store::Result<Self> {
        Self::new(
            Service::Azure {
                container_url,
                account,
                credentials,
            },
            sending,
        )
    }

    fn new(service: Service, (connector, retry): Sending<'_>) -> object_store::Result<Self> {
        // The URL's scheme decides; an endpoint on this machine may be plain HTTP.
        let options = ClientOptions::new().with_allow_http(true);
        Ok(Self {
            service,
            client: connector.connect(&options)?,
            retry: retry.clone(),
        })
    }

    /// The store's name in errors.
    fn store(&self) -> &'static str {
        match &self.service {
            Service::S3(_) => "S3",
            #[cfg(feature = "gcp")]
            Service::Gcs { .. } => "GCS",
            #[cfg(feature = "azure")]
            Service::Azure { .. } => "MicrosoftAzure",
        }
    }

    /// Whether this store has multipart uploads to list ([`open_at`](Self::open_at)): S3.
    pub(crate) fn lists_uploads(&self) -> bool {
        matches!(self.service, Service::S3(_))
    }

    /// Whether this store lists as Azure does (List Blobs), not as S3 (ListObjectsV2).
    fn lists_blobs(&self) -> bool {
        #[cfg(feature = "azure")]
        if let Service::Azure { .. } = self.service {
            return true;
        }
        false
    }

    /// A GET of the bucket (or container) with `query`, authorized.
    async fn request(
        &self,
        query: &[(&str, &str)],
    ) -> object_store::Result<http::Request<HttpRequestBody>> {
        #[cfg(any(feature = "gcp", feature = "azure"))]
        let with_query = |base: &str| {
            url::Url::parse_with_params(base, query.iter().copied()).map_err(|e| {
                object_store::Error::Generic {
                    store: self.store(),
                    source: format!("the URL {base}: {e}").into(),
                }
            })
        };
        let get = |url: &url::Url| {
            http::Request::get(url.as_str())
                .body(HttpRequestBody::empty())
                .map_err(|e| object_store::Error::Generic {
                    store: self.store(),
                    source: format!("building a request: {e}").into(),
                })
        };
        match &self.service {
            Service::S3(signer) => {
                let options = SignedUrlOptions::default().with_query(query.iter().copied());
                let url = signer
                    .signed_url_opts(Method::GET, &Path::default(), VALID_FOR, &options)
                    .await?;
                get(&url)
            }
            #[cfg(feature = "gcp")]
            Service::Gcs {
                bucket_url,
                credentials,
            } => {
                let mut request = get(&with_query(bucket_url)?)?;
                let bearer = credentials.get_credential().await?.bearer.clone();
                if !bearer.is_empty() {
                    let value =
                        http::HeaderValue::from_str(&format!("Bearer {bearer}")).map_err(|e| {
                            object_store::Error::Generic {
                                store: "GCS",
                                source: format!("the bearer token: {e}").into(),
                            }
                        })?;
                    request
                        .headers_mut()
                        .insert(http::header::AUTHORIZATION, value);
                }
                Ok(request)
            }
            #[cfg(feature = "azure")]
            Service::Azure {
                container_url,
                account,
                credentials,
            } => {
                let mut request = get(&with_query(container_url)?)?;
                let credential = credentials.get_credential().await?;
                object_store::azure::AzureAuthorizer::new(&credential, account)
                    .try_authorize(&mut request)?;
                Ok(request)
            }
        }
    }

    /// The body of a GET of the bucket with `query`; `what` names it in errors.
    async fn get_bucket(&self, query: &[(&str, &str)], what: &str) -> object_store::Result<String> {
        let failed = |why: String| object_store::Error::Generic {
            store: self.store(),
            source: why.into(),
        };
        let started = std::time::Instant::now();
        let mut backoff = self.retry.backoff.init_backoff;
        let mut retries = 0;
        loop {
            // Signed afresh each try: a presigned URL or a token may have expired meanwhile.
            let request = self.request(query).await?;
            let answer = match self.client.execute(request).await {
                Ok(response) => {
                    let status = response.status();
                    match response.into_body().bytes().await {
                        Ok(body) => Ok((status, String::from_utf8_lossy(&body).into_owned())),
                        Err(e) => Err(format!("reading the answer to {what}: {e}")),
                    }
                }
                Err(e) => Err(format!("{what}: {e}")),
            };
            let busy = |status: http::StatusCode| {
                status == http::StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
            };
            let why = match answer {
                Ok((status, text)) if status.is_success() => return Ok(text),
                Ok((status, text)) if !busy(status) => {
                    return Err(failed(format!("{what}: {status}: {text}")));
                }
                Ok((status, text)) => format!("{what}: {status}: {text}"),
                Err(why) => why,
            };
            if retries == self.retry.max_retries || started.elapsed() >= self.retry.retry_timeout {
                return Err(failed(format!("{why} (after {retries} retries)")));
            }
            tokio::time::sleep(backoff).await;
            backoff = backoff
                .mul_f64(self.retry.backoff.base)
                .min(self.retry.backoff.max_backoff);
            retries += 1;
        }
    }

    /// The ids of the uploads open at exactly `path` (S3's; see
    /// [`lists_uploads`](Self::lists_uploads)).
    pub(crate) async fn open_at(&self, path: &Path) -> object_store::Result<Vec<String>> {
        let query = [("uploads", ""), ("prefix", path.as_ref())];
        let what = format!("listing the uploads at {path}");
        Ok(uploads_at(
            &self.get_bucket(&query, &what).await?,
            path.as_ref(),
        ))
    }

    /// Every object under the directory `under` (every object for an empty one), page by
    /// page, each key parsed as `object_store` would and set aside where it cannot be.
    pub(crate) async fn objects_under(&self, under: &Path) -> object_store::Result<RawListing> {
        let prefix = if under.as_ref().is_empty() {
            String::new()
        } else {
            format!("{under}/")
        };
        let what = format!("listing the objects under {under}");
        let mut listing = RawListing::default();
        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            if self.lists_blobs() {
                let mut query = vec![
                    ("restype", "container"),
                    ("comp", "list"),
                    ("prefix", prefix.as_str()),
                ];
                if let Some(marker) = &token {
                    query.push(("marker", marker));
                }
                let page = self.get_bucket(&query, &what).await?;
                listing.add(page.split("<Blob>").skip(1), BLOB_FIELDS);
                token = field(&page, "NextMarker").filter(|marker| !marker.is_empty());
            } else {
                let mut query = vec![("list-type", "2"), ("prefix", prefix.as_str())];
                if let Some(token) = &token {
                    query.push(("continuation-token", token));
                }
                let page = self.get_bucket(&query, &what).await?;
                listing.add(page.split("<Contents>").skip(1), CONTENTS_FIELDS);
                let truncated = field(&page, "IsTruncated").is_some_and(|t| t == "true");
                token = field(&page, "NextContinuationToken").filter(|_| truncated);
            }
            if token.is_none() {
                return Ok(listing);
            }
        }
        Err(object_store::Error::Generic {
            store: self.store(),
            source: format!("{what}: more than {MAX_PAGES} pages").into(),
        })
    }
}

/// The names of an object's fields in one store's listing.
struct Fields {
    key: &'static str,
    size: &'static str,
    modified: &'static str,
    e_tag: &'static str,
    /// Reads `modified`.
    parse_time: fn(&str) -> Option<SystemTime>,
}

/// An object in ListObjectsV2 (S3, GCS).
const CONTENTS_FIELDS: Fields = Fields {
    key: "Key",
    size: "Size",
    modified: "LastModified",
    e_tag: "ETag",
    parse_time: parse_iso_time,
};

/// A blob in List Blobs (Azure).
const BLOB_FIELDS: Fields = Fields {
    key: "Name",
    size: "Content-Length",
    modified: "Last-Modified",
    e_tag: "Etag",
    parse_time: parse_http_time,
};

impl RawListing {
    /// Adds the objects of `entries` (each the XML of one, from its opening tag on).
    fn add<'a>(&mut self, entries: impl Iterator<Item = &'a str>, fields: Fields) {
        for entry in entries {
            let Some(key) = field(entry, fields.key) else {
                continue;
            };
            let size = field(entry, fields.size)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            // A time that does not parse reads as now: an object judged by its age (a staged
            // upload, a journal) then looks fresh and is kept, never old and removed.
            let modified = field(entry, fields.modified)
                .and_then(|t| (fields.parse_time)(&t))
                .unwrap_or_else(SystemTime::now);
            match Path::parse(&key) {
                Ok(location) => self.objects.push(ObjectMeta {
                    location,
                    last_modified: modified.into(),
                    size,
                    e_tag: field(entry, fields.e_tag),
                    version: None,
                }),
                Err(_) => self.unrepresentable.push(key),
            }
        }
    }
}

/// The text of the first `<name>` element in `xml`, unescaped.
fn field(xml: &str, name: &str) -> Option<String> {
    let (_, rest) = xml.split_once(&format!("<{name}>"))?;
    let (value, _) = rest.split_once(&format!("</{name}>"))?;
    Some(unescape(value))
}

/// The upload ids in a ListMultipartUploads answer whose key is exactly `key`.
fn uploads_at(answer: &str, key: &str) -> Vec<String> {
    answer
        .split("<Upload>")
        .skip(1)
        .filter_map(|upload| {
            (field(upload, "Key")? == key)
                .then(|| field(upload, "UploadId"))
                .flatten()
        })
        .collect()
}

/// XML's five predefined entities, as S3 escapes keys and ids.
fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// An ISO 8601 timestamp as S3 and GCS list them (`2026-12-03T13:25:00.000Z`, UTC).
fn parse_iso_time(text: &str) -> Option<SystemTime> {
    let (date, time) = text.trim_end_matches('Z').split_once('T')?;
    let mut ymd = date.splitn(3, '-').map(str::parse::<i64>);
    let (year, month, day) = (ymd.next()?.ok()?, ymd.next()?.ok()?, ymd.next()?.ok()?);
    let mut hms = time.splitn(3, ':');
    let hours: u64 = hms.next()?.parse().ok()?;
    let minutes: u64 = hms.next()?.parse().ok()?;
    let seconds: f64 = hms.next()?.parse().ok()?;
    let midnight = civil_midnight(year, month, day)?;
    Some(
        midnight
            + Duration::from_secs(hours * 3600 + minutes * 60)
            + Duration::from_secs_f64(seconds),
    )
}

/// An HTTP date as Azure lists them (`Thu, 03 Dec 2026 13:25:00 GMT`).
fn parse_http_time(text: &str) -> Option<SystemTime> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let mut words = text.split_whitespace().skip(1);
    let day: i64 = words.next()?.parse().ok()?;
    let name = words.next()?;
    let month = MONTHS.iter().position(|m| *m == name)?;
    let year: i64 = words.next()?.parse().ok()?;
    let mut hms = words.next()?.splitn(3, ':').map(str::parse::<u64>);
    let (hours, minutes, seconds) = (hms.next()?.ok()?, hms.next()?.ok()?, hms.next()?.ok()?);
    let midnight = civil_midnight(year, i64::try_from(month).ok()? + 1, day)?;
    Some(midnight + Duration::from_secs(hours * 3600 + minutes * 60 + seconds))
}

/// The start of a civil date, UTC (Howard Hinnant's days-from-civil).
fn civil_midnight(year: i64, month: i64, day: i64) -> Option<SystemTime> {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(days * 86_400))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_uploads_of_the_exact_key_are_taken() {
        let answer = "<ListMultipartUploadsResult><Bucket>b</Bucket>\
            <Upload><Key>run/m.bpk</Key><UploadId>one</UploadId></Upload>\
            <Upload><Key>run/m.bpk.old</Key><UploadId>two</UploadId></Upload>\
            <Upload><Key>run/a&amp;b</Key><UploadId>th&lt;ree</UploadId></Upload>\
            <Upload><Key>run/m.bpk</Key><UploadId>four</UploadId></Upload>\
            </ListMultipartUploadsResult>";
        assert_eq!(uploads_at(answer, "run/m.bpk"), ["one", "four"]);
        assert_eq!(uploads_at(answer, "run/a&b"), ["th<ree"]);
        assert!(uploads_at(answer, "run").is_empty());
    }

    #[test]
    fn listed_times_read_as_utc() {
        let at =
            |text| parse_iso_time(text).and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok());
        assert_eq!(at("1970-01-01T00:00:00.000Z"), Some(Duration::ZERO));
        assert_eq!(
            at("2000-03-01T00:00:01Z"),
            Some(Duration::from_secs(951_868_801))
        );
        assert_eq!(
            at("2026-12-03T13:25:00.500Z"),
            Some(Duration::from_millis(1_796_304_300_500))
        );
        assert_eq!(at("yesterday"), None);
        let http = |text| {
            parse_http_time(text).and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        };
        assert_eq!(
            http("Thu, 03 Dec 2026 13:25:00 GMT"),
            Some(Duration::from_secs(1_796_304_300))
        );
        assert_eq!(
            http("Wed, 01 Mar 2000 00:00:01 GMT"),
            Some(Duration::from_secs(951_868_801))
        );
        assert_eq!(http("Thu, 03 Dez 2026 13:25:00 GMT"), None);
    }

    #[test]
    fn keys_no_path_can_hold_are_set_aside_in_either_listing() {
        let contents = "<ListBucketResult><Contents><Key>run/step-1/a.bpk</Key><Size>7</Size>\
            <LastModified>2026-12-03T13:25:00.000Z</LastModified><ETag>&quot;e&quot;</ETag></Contents>\
            <Contents><Key>run/step-1/../../x</Key><Size>1</Size></Contents></ListBucketResult>";
        let mut listing = RawListing::default();
        listing.add(contents.split("<Contents>").skip(1), CONTENTS_FIELDS);
        let blobs = "<EnumerationResults><Blobs><Blob><Name>run//b.bpk</Name><Properties>\
            <Last-Modified>Thu, 03 Dec 2026 13:25:00 GMT</Last-Modified><Etag>0x1</Etag>\
            <Content-Length>9</Content-Length></Properties></Blob>\
            <Blob><Name>run/c.bpk</Name><Properties><Content-Length>3</Content-Length>\
            </Properties></Blob></Blobs><NextMarker /></EnumerationResults>";
        listing.add(blobs.split("<Blob>").skip(1), BLOB_FIELDS);
        let found: Vec<_> = listing
            .objects
            .iter()
            .map(|o| (o.location.to_string(), o.size, o.e_tag.clone()))
            .collect();
        assert_eq!(
            found,
            [
                ("run/step-1/a.bpk".to_owned(), 7, Some("\"e\"".to_owned())),
                ("run/c.bpk".to_owned(), 3, None)
            ]
        );
        assert_eq!(
            listing.unrepresentable,
            ["run/step-1/../../x", "run//b.bpk"]
        );
    }
}
