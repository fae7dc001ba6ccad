//! Finding the multipart uploads open at a key on S3, for a journal whose writer died after
//! the store created its upload and before the id was recorded (a window of one request). S3
//! lists them (ListMultipartUploads) but `object_store` does not ask it, so the request is
//! presigned with the store's own credentials (`object_store`'s [`Signer`]) and sent with its
//! HTTP client.

use std::sync::Arc;
use std::time::Duration;

use object_store::ClientOptions;
use object_store::client::{HttpClient, HttpConnector, HttpRequestBody, ReqwestConnector};
use object_store::path::Path;
use object_store::signer::{Method, SignedUrlOptions, Signer};

/// How long the presigned listing request stays valid.
const VALID_FOR: Duration = Duration::from_secs(300);

/// Lists the multipart uploads open at a key of one S3 bucket.
#[derive(Debug)]
pub(crate) struct UploadLister {
    signer: Arc<dyn Signer>,
    client: HttpClient,
}

impl UploadLister {
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

    /// The ids of the uploads open at exactly `path`.
    pub(crate) async fn open_at(&self, path: &Path) -> object_store::Result<Vec<String>> {
        let options =
            SignedUrlOptions::default().with_query([("uploads", ""), ("prefix", path.as_ref())]);
        let url = self
            .signer
            .signed_url_opts(Method::GET, &Path::default(), VALID_FOR, &options)
            .await?;
        let failed = |what: String| object_store::Error::Generic {
            store: "S3",
            source: what.into(),
        };
        let request = http::Request::get(url.as_str())
            .body(HttpRequestBody::empty())
            .map_err(|e| failed(format!("building the upload listing request: {e}")))?;
        let response = self
            .client
            .execute(request)
            .await
            .map_err(|e| failed(format!("listing the uploads at {path}: {e}")))?;
        let status = response.status();
        let body = response
            .into_body()
            .bytes()
            .await
            .map_err(|e| failed(format!("reading the upload listing of {path}: {e}")))?;
        let text = String::from_utf8_lossy(&body);
        if !status.is_success() {
            return Err(failed(format!(
                "listing the uploads at {path}: {status}: {text}"
            )));
        }
        Ok(uploads_at(&text, path.as_ref()))
    }
}

/// The upload ids in a ListMultipartUploads answer whose key is exactly `key`.
fn uploads_at(answer: &str, key: &str) -> Vec<String> {
    answer
        .split("<Upload>")
        .skip(1)
        .filter_map(|upload| {
            let field = |name: &str| {
                let (_, rest) = upload.split_once(&format!("<{name}>"))?;
                let (value, _) = rest.split_once(&format!("</{name}>"))?;
                Some(unescape(value))
            };
            (field("Key")? == key).then(|| field("UploadId")).flatten()
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
}
