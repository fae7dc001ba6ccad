//! The HTTP client every cloud store of [`open_url`](crate::open_url) talks through: each
//! request waits its turn at the store's [`Throttle`], and is cut by its [`StallWatch`] once it
//! stalls, waiting for its answer or reading the answer's body; a ranged GET slower than its
//! peers is sent a second time (hedged).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::{Either, select};
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};

use crate::stall::StallWatch;
use crate::throttle::Throttle;

/// An HTTP connector for object_store's builders (`with_http_connector`): object_store's own
/// reqwest client, whose requests keep `throttle`'s pace and are watched by `stalls`. Record
/// both on the storage ([`ObjectStorage::with_throttle`](crate::ObjectStorage::with_throttle),
/// [`with_stall_watch`](crate::ObjectStorage::with_stall_watch)) so it reports them.
pub fn http_connector(throttle: &Arc<Throttle>, stalls: &Arc<StallWatch>) -> impl HttpConnector {
    GuardedConnector {
        throttle: Arc::clone(throttle),
        stalls: Arc::clone(stalls),
    }
}

#[derive(Debug)]
struct GuardedConnector {
    throttle: Arc<Throttle>,
    stalls: Arc<StallWatch>,
}

impl HttpConnector for GuardedConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Guarded {
            inner,
            throttle: Arc::clone(&self.throttle),
            stalls: Arc::clone(&self.stalls),
        }))
    }
}

#[derive(Debug)]
struct Guarded {
    inner: HttpClient,
    throttle: Arc<Throttle>,
    stalls: Arc<StallWatch>,
}

impl Guarded {
    /// Sends `request`, and a copy of it once `after` has passed without an answer if the
    /// hedging budget allows; the first answer wins and the other request is dropped (its
    /// connection closed). An error of one waits for the other.
    async fn hedged(
        &self,
        request: HttpRequest,
        after: Duration,
    ) -> Result<HttpResponse, HttpError> {
        let copy = copy_of(&request);
        let first = std::pin::pin!(self.inner.execute(request));
        let wait = std::pin::pin!(tokio::time::sleep(after));
        let first = match select(first, wait).await {
            Either::Left((response, _)) => return response,
            Either::Right(((), first)) => first,
        };
        if !self.stalls.take_hedge() {
            return first.await;
        }
        let second = std::pin::pin!(self.inner.execute(copy));
        match select(first, second).await {
            Either::Left((Ok(response), _)) => Ok(response),
            Either::Left((Err(_), second)) => second.await,
            Either::Right((Ok(response), _)) => {
                self.stalls.hedge_won();
                Ok(response)
            }
            Either::Right((Err(_), first)) => first.await,
        }
    }
}

#[async_trait]
impl HttpService for Guarded {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let body_len = request.body().content_length();
        let retried = retried_once_cut(&request);
        let watched_body = is_object_read(&request) || is_multipart_start(&request);
        let ranged = is_ranged_get(&request);
        let identity = retry_identity(&request);
        let sent = self.throttle.pace().await;
        let answer = std::pin::pin!(async {
            match ranged.then(|| self.stalls.hedge_after()).flatten() {
                Some(after) => self.hedged(request, after).await,
                None => self.inner.execute(request).await,
            }
        });
        let response = if !retried {
            answer.await
        } else {
            let stalled = std::pin::pin!(self.stalls.stalled_waiting(&identity, sent, body_len));
            match select(answer, stalled).await {
                Either::Left((response, _)) => response,
                // Dropping the request closes its connection.
                Either::Right((error, _)) => Err(error),
            }
        };
        self.throttle
            .observe(sent, response.as_ref().ok().map(|r| r.status().as_u16()));
        let response = response?;
        self.stalls.observe_answer(sent.elapsed(), body_len, ranged);
        self.stalls.answered(&identity);
        Ok(if watched_body {
            response.map(|body| self.stalls.watch_body(body))
        } else {
            response
        })
    }
}

/// Whether a request is tried again once it times out, so that cutting it costs a retry
/// rather than the operation: reads (GET, HEAD, pinned to an ETag or not), unconditional PUTs
/// (objects, parts, blocks, block lists, copies), and starting a multipart upload (POST with
/// `uploads`), all of which object_store marks idempotent; and deletes (DELETE, S3's POST
/// `?delete`), which this crate sends again itself (`landed::delete`).
///
/// Conditional writes (create-new's `If-None-Match`) are not: a cut would fail a write a slow
/// store was about to carry out, so they wait for the request timeout. Nor is completing a
/// multipart upload (POST with `uploadId`): the store joins every part before it answers, so
/// its wait grows with the object's size, which the request does not show (S3 may take
/// minutes, and keeps the connection open with whitespace meanwhile), and a cut can lose the
/// save: s3s-fs forgets the upload before it joins the parts and stops joining when the
/// connection closes, so the retry is refused (403) and nothing was written. A 2 GiB save to
/// s3s-fs failed so, its completion cut after 2 s.
fn retried_once_cut(request: &HttpRequest) -> bool {
    let headers = request.headers();
    let conditional = headers.contains_key(http::header::IF_NONE_MATCH)
        || headers.contains_key(http::header::IF_MATCH);
    match *request.method() {
        http::Method::GET | http::Method::HEAD | http::Method::DELETE => true,
        http::Method::PUT => !conditional,
        http::Method::POST => {
            !conditional && (is_multipart_start(request) || names_query(request, "delete"))
        }
        _ => false,
    }
}

/// Whether a request reads an object's bytes: a GET with a range, or with no query (a listing
/// has one). object_store resumes such a body from the last byte received when it fails, so
/// its body is watched. Listings' bodies are not tried again, and are left to the request
/// timeout.
fn is_object_read(request: &HttpRequest) -> bool {
    *request.method() == http::Method::GET
        && (request.headers().contains_key(http::header::RANGE)
            || request.uri().query().is_none_or(str::is_empty))
}

/// Whether a request starts a multipart upload (POST with `uploads`). The sink starts again
/// when its answer is lost, so a body that stalls is cut rather than waited for.
fn is_multipart_start(request: &HttpRequest) -> bool {
    *request.method() == http::Method::POST && names_query(request, "uploads")
}

/// Whether the request's query has a parameter called `name` (`?delete`, `?uploadId=…`).
fn names_query(request: &HttpRequest, name: &str) -> bool {
    request
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .any(|pair| pair.split('=').next() == Some(name))
}

/// Whether a request reads a range of an object (what a hedged read sends twice).
fn is_ranged_get(request: &HttpRequest) -> bool {
    *request.method() == http::Method::GET && request.headers().contains_key(http::header::RANGE)
}

/// What names a request and its retries for stall detection: method, address and range (a
/// resumed read asks for another range, and is another request).
fn retry_identity(request: &HttpRequest) -> String {
    let range = request
        .headers()
        .get(http::header::RANGE)
        .and_then(|range| range.to_str().ok())
        .unwrap_or("");
    format!("{} {} {range}", request.method(), request.uri())
}

/// The same request again: method, address, headers (the signature and the ETag condition
/// included) and body.
fn copy_of(request: &HttpRequest) -> HttpRequest {
    let mut copy = http::Request::new(request.body().clone());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    copy
}
