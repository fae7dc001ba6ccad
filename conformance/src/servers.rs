//! Whether the local test servers are required, where the S3 and Azure ones are, and proxies that inject
//! faults in front of them.

/// Whether servers are required (`WEIGHTBAY_REQUIRE_SERVERS=1`, as CI sets).
pub(crate) fn servers_required() -> bool {
    std::env::var("WEIGHTBAY_REQUIRE_SERVERS").is_ok_and(|v| v == "1")
}

/// For a plain `#[test]` that needs the local S3 server: its URL (`WEIGHTBAY_S3_URL`, set by
/// `scripts/servers.sh start s3`), or `None` after saying on standard error that the test
/// skips, and why. A test then returns early; libtest still lists it as passed, which is why
/// CI sets `WEIGHTBAY_REQUIRE_SERVERS=1`.
///
/// # Panics
/// When the server is unset and `WEIGHTBAY_REQUIRE_SERVERS=1`.
pub fn s3_url() -> Option<String> {
    server_url("WEIGHTBAY_S3_URL", "s3", "an S3 server")
}

/// As [`s3_url`], for the local Azure server (Azurite, `WEIGHTBAY_AZURE_URL`, set by
/// `scripts/servers.sh start azure`).
///
/// # Panics
/// When the server is unset and `WEIGHTBAY_REQUIRE_SERVERS=1`.
pub fn azure_url() -> Option<String> {
    server_url("WEIGHTBAY_AZURE_URL", "azure", "an Azure server")
}

fn server_url(variable: &str, kind: &str, what: &str) -> Option<String> {
    match std::env::var(variable) {
        Ok(url) => Some(url),
        Err(_) if servers_required() => {
            panic!("WEIGHTBAY_REQUIRE_SERVERS=1 but {variable} is unset")
        }
        Err(_) => {
            eprintln!(
                "skipped: no {what} (vars=$(scripts/servers.sh start {kind}) && eval \"$vars\")"
            );
            None
        }
    }
}

/// A fault-injecting proxy of a test's own, in front of one of the local servers: taken from
/// the control port of `scripts/fault_proxy.py` (`WEIGHTBAY_FAULT_PROXY`, set by
/// `scripts/servers.sh start proxy`), and closed when dropped. Traffic stays on 127.0.0.1.
#[derive(Debug)]
pub struct FaultProxy {
    control: String,
    port: u16,
}

impl FaultProxy {
    /// A proxy in front of `upstream` (an `http://127.0.0.1:PORT` URL) that injects `faults`, a
    /// JSON object as `scripts/fault_proxy.py` documents (`{"status_share": 0.1}`,
    /// `{"stall": {"match": "partNumber=2", "times": 1}}`, …); `None` after saying on standard
    /// error that the test skips, when no proxy runs.
    ///
    /// # Panics
    /// When no proxy runs and `WEIGHTBAY_REQUIRE_SERVERS=1`, or the proxy refuses the request.
    pub fn start(upstream: &str, faults: &str) -> Option<Self> {
        let control = match std::env::var("WEIGHTBAY_FAULT_PROXY") {
            Ok(url) => url,
            Err(_) if servers_required() => {
                panic!("WEIGHTBAY_REQUIRE_SERVERS=1 but WEIGHTBAY_FAULT_PROXY is unset")
            }
            Err(_) => {
                eprintln!(
                    "skipped: no fault proxy (vars=$(scripts/servers.sh start proxy) && eval \"$vars\")"
                );
                return None;
            }
        };
        let body = format!(r#"{{"upstream": "{upstream}", "faults": {faults}}}"#);
        let answer = http_request(&control, "POST", "/proxies", &body)
            .unwrap_or_else(|e| panic!("the fault proxy at {control} refused {body}: {e}"));
        let port = json_number(&answer, "port")
            .and_then(|port| u16::try_from(port).ok())
            .unwrap_or_else(|| panic!("the fault proxy answered {answer}"));
        Some(Self { control, port })
    }

    /// A proxy in front of the local S3 server (`AWS_ENDPOINT`) injecting `faults`, with the
    /// server's URL ([`s3_url`]); give the client the proxy's [`url`](Self::url) as its
    /// endpoint. `None` after saying why the test skips, as [`s3_url`] and [`start`](Self::start).
    ///
    /// # Panics
    /// As [`s3_url`] and [`start`](Self::start), and when `WEIGHTBAY_S3_URL` is set but
    /// `AWS_ENDPOINT` is not.
    pub fn in_front_of_s3(faults: &str) -> Option<(String, Self)> {
        let url = s3_url()?;
        let Ok(endpoint) = std::env::var("AWS_ENDPOINT") else {
            panic!("WEIGHTBAY_S3_URL is set but AWS_ENDPOINT is not");
        };
        Some((url, Self::start(&endpoint, faults)?))
    }

    /// The URL to give the client instead of the server's.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// How many times the proxy did `what` so far: `requests`, `forwarded`, `status`, `reset`,
    /// `request_reset`, `stalled`, `failed` or `rate_limited`.
    ///
    /// # Panics
    /// When the proxy does not answer.
    pub fn count(&self, what: &str) -> u64 {
        let path = format!("/proxies/{}", self.port);
        let answer = http_request(&self.control, "GET", &path, "")
            .unwrap_or_else(|e| panic!("the fault proxy did not answer {path}: {e}"));
        json_number(&answer, what).unwrap_or_else(|| panic!("no `{what}` in {answer}"))
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let _ = http_request(
            &self.control,
            "DELETE",
            &format!("/proxies/{}", self.port),
            "",
        );
    }
}

/// The multipart uploads open on the local S3 server (`WEIGHTBAY_S3_URL`, `AWS_ENDPOINT`)
/// under the key prefix `prefix` of its bucket, by key, as the server's ListMultipartUploads
/// answers: what a killed writer could leave billed. `None` after saying on standard error that
/// the test skips, when the server is not running.
///
/// # Panics
/// When the server is unset and `WEIGHTBAY_REQUIRE_SERVERS=1`, or it does not answer.
pub fn s3_open_uploads(prefix: &str) -> Option<Vec<String>> {
    let (endpoint, bucket) = s3_server()?;
    // The local server does not check signatures, so a plain request lists what is there.
    let path = format!("/{bucket}?uploads&prefix={prefix}");
    let answer = http_request(&endpoint, "GET", &path, "")
        .unwrap_or_else(|e| panic!("the S3 server at {endpoint} did not answer {path}: {e}"));
    assert!(
        !answer.contains("<IsTruncated>true</IsTruncated>"),
        "more open uploads under {prefix} than one listing holds"
    );
    Some(
        answer
            .split("<Upload>")
            .skip(1)
            .filter_map(|upload| {
                let key = upload.split_once("<Key>")?.1.split_once("</Key>")?.0;
                Some(key.to_owned())
            })
            .collect(),
    )
}

/// A local server whose objects a test can put and remove as they are, `.`, `..` and empty
/// segments included, which no `object_store` client can write (neither server checks a
/// signature): how a test plants an object that a hostile writer could.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerbatimServer {
    /// The S3 server (`WEIGHTBAY_S3_URL`, `AWS_ENDPOINT`).
    S3,
    /// The GCS fixture (`WEIGHTBAY_GCS_URL`, `GCS_ENDPOINT`).
    Gcs,
}

impl VerbatimServer {
    /// The server's endpoint and bucket, or `None` (having said why on standard error) when
    /// it is not running.
    ///
    /// # Panics
    /// When the server is unset and `WEIGHTBAY_REQUIRE_SERVERS=1`.
    fn endpoint_and_bucket(self) -> Option<(String, String)> {
        let (url, scheme, endpoint) = match self {
            Self::S3 => (s3_url()?, "s3://", "AWS_ENDPOINT"),
            Self::Gcs => (
                server_url("WEIGHTBAY_GCS_URL", "gcs", "a GCS server")?,
                "gs://",
                "GCS_ENDPOINT",
            ),
        };
        let bucket = url
            .trim_start_matches(scheme)
            .split('/')
            .next()
            .unwrap_or_default();
        let endpoint = std::env::var(endpoint).ok()?;
        Some((endpoint, bucket.to_owned()))
    }

    /// Puts `body` at `key` of the server's bucket as it is. `None` after saying on standard
    /// error that the test skips, when the server is not running.
    ///
    /// # Panics
    /// When the server is unset and `WEIGHTBAY_REQUIRE_SERVERS=1`, or it refuses the object.
    pub fn put(self, key: &str, body: &str) -> Option<()> {
        let (endpoint, bucket) = self.endpoint_and_bucket()?;
        let path = verbatim_path(&bucket, key);
        http_request(&endpoint, "PUT", &path, body)
            .unwrap_or_else(|e| panic!("the server at {endpoint} refused {path}: {e}"));
        Some(())
    }

    /// Removes `key` of the server's bucket as it is, what [`put`](Self::put) put there.
    ///
    /// # Panics
    /// When the server does not answer.
    pub fn delete(self, key: &str) -> Option<()> {
        let (endpoint, bucket) = self.endpoint_and_bucket()?;
        match self {
            // moto refuses an unsigned DELETE of one object, but not DeleteObjects.
            Self::S3 => {
                let key = key
                    .replace('&', "&amp;")
                    .replace('<', "&lt;")
                    .replace('>', "&gt;");
                let body = format!("<Delete><Object><Key>{key}</Key></Object></Delete>");
                http_request(&endpoint, "POST", &format!("/{bucket}?delete"), &body)
                    .unwrap_or_else(|e| {
                        panic!("the server at {endpoint} did not delete {key}: {e}")
                    });
            }
            // Answered with 204, which `http_request` counts as a failure, so the answer is
            // not read: a key left behind is found by the caller's next listing.
            Self::Gcs => {
                let _ = http_request(&endpoint, "DELETE", &verbatim_path(&bucket, key), "");
            }
        }
        Some(())
    }
}

/// The local S3 server's endpoint and bucket, or `None` (having said why) when it is not
/// running.
fn s3_server() -> Option<(String, String)> {
    VerbatimServer::S3.endpoint_and_bucket()
}

/// The request path of `key` of `bucket`, its dots percent-encoded so that neither the request
/// nor the server folds a `..` away.
fn verbatim_path(bucket: &str, key: &str) -> String {
    format!("/{bucket}/{}", key.replace('.', "%2E"))
}

/// One HTTP/1.1 request to a server on this machine (`http://127.0.0.1:PORT`); the body of a
/// 200 answer, or an error holding the answer.
fn http_request(base: &str, method: &str, path: &str, body: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let address = base.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    if !head.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(format!("{head}: {body}")));
    }
    Ok(body.to_owned())
}

/// The number `"name": N` in a flat JSON object.
fn json_number(json: &str, name: &str) -> Option<u64> {
    let start = json.find(&format!("\"{name}\""))? + name.len() + 2;
    let rest = json[start..].trim_start().strip_prefix(':')?.trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}
