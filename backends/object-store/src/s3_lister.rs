//! What S3 lists that `object_store` does not ask, or cannot parse, through requests presigned
//! with the store's own credentials (`object_store`'s [`Signer`]) and sent with its HTTP
//! client:
//! - the multipart uploads open at a key (ListMultipartUploads), for a journal whose writer died
//!   after the store created its upload and before the id was recorded (a window of one
//!   request);
//! - the objects under a prefix (ListObjectsV2) when one of their keys is no valid
//!   `object_store` path (a `.`, `..` or empty segment, as in `runs/a/step-1/../../x`, which
//!   anyone with write access can create): `object_store` fails the whole page it is in, so one
//!   planted object would make every listing of the prefix fail.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use object_store::client::{HttpClient, HttpConnector, HttpRequestBody, ReqwestConnector};
use object_store::path::Path;
use object_store::signer::{Method, SignedUrlOptions, Signer};
use object_store::{ClientOptions, ObjectMeta};

/// How long a presigned listing request stays valid.
const VALID_FOR: Duration = Duration::from_secs(300);

/// The most pages one listing of objects follows: 10 million keys at S3's 1,000 a page, so a
/// server that hands out continuation tokens without end cannot hold a listing forever.
const MAX_PAGES: usize = 10_000;

/// Lists what `object_store` does not, on one S3 bucket.
#[derive(Debug)]
pub(crate) struct S3Lister {
    signer: Arc<dyn Signer>,
    client: HttpClient,
}

/// The objects under a prefix, as S3 lists them: those whose keys are valid paths, and the
/// keys of the others (which no container can have).
#[derive(Debug, Default)]
pub(crate) struct RawListing {
    pub(crate) objects: Vec<ObjectMeta>,
    pub(crate) unrepresentable: Vec<String>,
}

impl S3Lister {
    /// A lister signing with `signer` (the bucket's store).
    #[cfg_attr(not(feature = "aws"), allow(dead_code))]
    pub(crate) fn new(signer: Arc<dyn Signer>) -> object_store::Result<Self> {
        // The URL's scheme decides; an endpoint on this machine may be plain HTTP.
        let options = ClientOptions::new().with_allow_http(true);
        Ok(Self {
            signer,
            client: ReqwestConnector::default().connect(&options)?,
        })
    }

    /// The body of a GET of the bucket with `query`, presigned; `what` names it in errors.
    async fn get_bucket(&self, query: &[(&str, &str)], what: &str) -> object_store::Result<String> {
        let options = SignedUrlOptions::default().with_query(query.iter().copied());
        let url = self
            .signer
            .signed_url_opts(Method::GET, &Path::default(), VALID_FOR, &options)
            .await?;
        let failed = |why: String| object_store::Error::Generic {
            store: "S3",
            source: why.into(),
        };
        let request = http::Request::get(url.as_str())
            .body(HttpRequestBody::empty())
            .map_err(|e| failed(format!("building the request for {what}: {e}")))?;
        let response = self
            .client
            .execute(request)
            .await
            .map_err(|e| failed(format!("{what}: {e}")))?;
        let status = response.status();
        let body = response
            .into_body()
            .bytes()
            .await
            .map_err(|e| failed(format!("reading the answer to {what}: {e}")))?;
        let text = String::from_utf8_lossy(&body).into_owned();
        if !status.is_success() {
            return Err(failed(format!("{what}: {status}: {text}")));
        }
        Ok(text)
    }

    /// The ids of the uploads open at exactly `path`.
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
            let mut query = vec![("list-type", "2"), ("prefix", prefix.as_str())];
            if let Some(token) = &token {
                query.push(("continuation-token", token));
            }
            let page = self.get_bucket(&query, &what).await?;
            for contents in page.split("<Contents>").skip(1) {
                let Some(key) = field(contents, "Key") else {
                    continue;
                };
                let size = field(contents, "Size")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                let modified = field(contents, "LastModified")
                    .and_then(|t| parse_time(&t))
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                match Path::parse(&key) {
                    Ok(location) => listing.objects.push(ObjectMeta {
                        location,
                        last_modified: modified.into(),
                        size,
                        e_tag: field(contents, "ETag"),
                        version: None,
                    }),
                    Err(_) => listing.unrepresentable.push(key),
                }
            }
            let truncated = field(&page, "IsTruncated").is_some_and(|t| t == "true");
            match field(&page, "NextContinuationToken") {
                Some(next) if truncated => token = Some(next),
                _ => return Ok(listing),
            }
        }
        Err(object_store::Error::Generic {
            store: "S3",
            source: format!("{what}: more than {MAX_PAGES} pages").into(),
        })
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

/// An S3 timestamp (`2026-12-03T13:25:00.000Z`, UTC) as a time.
fn parse_time(text: &str) -> Option<SystemTime> {
    let (date, time) = text.trim_end_matches('Z').split_once('T')?;
    let mut ymd = date.splitn(3, '-').map(str::parse::<i64>);
    let (year, month, day) = (ymd.next()?.ok()?, ymd.next()?.ok()?, ymd.next()?.ok()?);
    let mut hms = time.splitn(3, ':');
    let hours: u64 = hms.next()?.parse().ok()?;
    let minutes: u64 = hms.next()?.parse().ok()?;
    let seconds: f64 = hms.next()?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    let secs = days * 86_400 + hours * 3600 + minutes * 60;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_secs_f64(seconds))
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
    fn s3_times_read_as_utc() {
        let at =
            |text| parse_time(text).and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok());
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
    }
}
