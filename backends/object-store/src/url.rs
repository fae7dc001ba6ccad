//! Opening a store from a URL (`s3://`, `gs://`, `az://`, `file://`, `memory://`), configured
//! from the standard environment variables as `object_store` users configure it.

use std::sync::Arc;
use std::time::Duration;

use object_store::multipart::MultipartStore;
use object_store::{ObjectStore, ObjectStoreScheme};
use weightbay::{Error, ErrorKind, Result};

use crate::error::convert;
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
use crate::http_client::http_connector;
use crate::options::{ObjectStoreOptions, StallDetection};
use crate::raw_lister::RawLister;
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
use crate::stall::StallWatch;
use crate::storage::ObjectStorage;
use crate::throttle::Throttle;

/// Opens the store a URL names: `s3://bucket/prefix`, `gs://bucket/prefix`,
/// `az://container/prefix` (and the https forms `object_store` recognises), `file:///dir`,
/// `memory:///prefix`. Cloud stores start from their standard environment variables
/// (`AWS_*`, `GOOGLE_*`, `AZURE_*`), then apply `options` (object_store configuration keys,
/// such as `aws_endpoint`), exactly as `object_store` users configure them; S3 then takes what
/// neither set from the profile of the AWS shared files (`~/.aws/credentials`,
/// `~/.aws/config`, `AWS_PROFILE`) as the AWS CLI and boto3 do: keys, `credential_process`,
/// `region`, `endpoint_url`. Credentials are never logged or put in error messages.
///
/// Options named `weightbay_*` are this crate's: `weightbay_stall_detection` (`on` or `off`),
/// `weightbay_stall_floor_secs`, `weightbay_stall_factor`, `weightbay_stall_min_body_rate` and
/// `weightbay_hedged_reads_percent` set [`ObjectStoreOptions::stall_detection`] (see
/// [`StallDetection`]); `weightbay_fetch_request_len` (bytes, or `whole`) sets
/// [`ObjectStoreOptions::fetch_request_len`], which otherwise follows where the store runs
/// (`whole` for an endpoint on this machine). Where an option is not given, the environment
/// variable of the same name in capitals is read.
///
/// # Errors
/// [`ErrorKind::InvalidInput`] for a URL that is not one of these, or a bad option.
pub fn open_url<I, K, V>(url: &str, options: I) -> Result<ObjectStorage>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: Into<String>,
{
    open_url_with(url, options, Retry::default())
}

/// How cloud stores retry: object_store's policy when a cloud store is built in.
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
pub(crate) type Retry = object_store::RetryConfig;
#[cfg(not(any(feature = "aws", feature = "gcp", feature = "azure")))]
pub(crate) type Retry = ();

/// [`open_url`] with an explicit retry policy for the cloud stores (object_store's default
/// retries for up to three minutes; a command-line tool may want to give up sooner).
///
/// # Errors
/// As [`open_url`].
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
pub fn open_url_with_retry<I, K, V>(
    url: &str,
    options: I,
    retry: object_store::RetryConfig,
) -> Result<ObjectStorage>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: Into<String>,
{
    open_url_with(url, options, retry)
}

pub(crate) fn open_url_with<I, K, V>(url: &str, options: I, retry: Retry) -> Result<ObjectStorage>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: Into<String>,
{
    let bad = |message: String| Error::invalid(message);
    let (ours, options): (Vec<Setting>, Vec<Setting>) = options
        .into_iter()
        .map(|(key, value)| (key.as_ref().to_owned(), value.into()))
        .partition(|(key, _)| key.to_ascii_lowercase().starts_with(OPTION_PREFIX));
    let OwnOptions {
        stall_detection,
        fetch_request_len,
    } = own_options(&ours, &|name| std::env::var(name).ok()).map_err(|e| e.with_key(url))?;
    let parsed = url::Url::parse(url).map_err(|e| bad(format!("`{url}` is not a URL: {e}")))?;
    let (scheme, prefix) = ObjectStoreScheme::parse(&parsed)
        .map_err(|e| bad(format!("`{url}` names no known object store: {e}")))?;
    #[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
    let configure =
        |message: &str, e: object_store::Error| convert(message.to_owned(), e).with_key(url);
    #[cfg(not(any(feature = "aws", feature = "gcp", feature = "azure")))]
    let _ = (retry, options);
    let mut durable = true;
    // Whether the store runs on this machine, which changes how loads are split.
    let local;
    // Cloud stores pace their requests when throttled; files and memory never are.
    #[cfg_attr(
        not(any(feature = "aws", feature = "gcp", feature = "azure")),
        allow(unused_mut)
    )]
    let mut throttle: Option<Arc<Throttle>> = None;
    // A store that lists what object_store does not: objects whose keys object_store cannot
    // parse (S3, GCS, Azure), and a key's open uploads, for cleaning up after killed writers
    // (S3).
    #[cfg_attr(
        not(any(feature = "aws", feature = "gcp", feature = "azure")),
        allow(unused_mut)
    )]
    let mut raw_lister: Option<Arc<RawLister>> = None;
    // Every request of a cloud store is watched for stalls, with the settings of the
    // storage's options (set below, and again by whoever changes them).
    #[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
    let stalls = Arc::new(StallWatch::new(stall_detection));
    let (store, multipart): (Arc<dyn ObjectStore>, Option<Arc<dyn MultipartStore>>) = match scheme {
        #[cfg(feature = "aws")]
        ObjectStoreScheme::AmazonS3 => {
            use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
            let mut builder = AmazonS3Builder::from_env()
                .with_url(url)
                .with_retry(retry.clone());
            for (key, value) in options {
                let key: AmazonS3ConfigKey =
                    key.parse().map_err(|e| configure("bad S3 option", e))?;
                builder = builder.with_config(key, value);
            }
            // What neither the environment nor the options set, the AWS shared files may.
            let env = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
            builder = crate::aws_profile::apply(builder, &env).map_err(|e| e.with_key(url))?;
            let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint);
            let shared = Throttle::shared(&store_name(&parsed, endpoint.as_deref()));
            builder = builder.with_http_connector(http_connector(&shared, &stalls));
            throttle = Some(Arc::clone(&shared));
            if builder
                .get_config_value(&AmazonS3ConfigKey::CopyIfNotExists)
                .is_none()
            {
                // Create-new of large containers needs a conditional copy.
                builder = builder.with_config(AmazonS3ConfigKey::CopyIfNotExists, "multipart");
            }
            local = builder
                .get_config_value(&AmazonS3ConfigKey::Endpoint)
                .is_some_and(|endpoint| is_loopback(&endpoint));
            let store = Arc::new(
                builder
                    .build()
                    .map_err(|e| configure("configuring S3", e))?,
            );
            raw_lister = Some(Arc::new(
                RawLister::s3(store.clone(), (&http_connector(&shared, &stalls), &retry))
                    .map_err(|e| configure("configuring S3", e))?,
            ));
            (store.clone(), Some(store))
        }
        #[cfg(feature = "gcp")]
        ObjectStoreScheme::GoogleCloudStorage => {
            use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
            let mut builder = GoogleCloudStorageBuilder::from_env()
                .with_url(url)
                .with_retry(retry.clone());
            for (key, value) in options {
                let key: GoogleConfigKey =
                    key.parse().map_err(|e| configure("bad GCS option", e))?;
                builder = builder.with_config(key, value);
            }
            let endpoint = builder.get_config_value(&GoogleConfigKey::BaseUrl);
            let shared = Throttle::shared(&store_name(&parsed, endpoint.as_deref()));
            builder = builder.with_http_connector(http_connector(&shared, &stalls));
            throttle = Some(Arc::clone(&shared));
            local = endpoint.is_some_and(|endpoint| is_loopback(&endpoint));
            let store = Arc::new(
                builder
                    .clone()
                    .build()
                    .map_err(|e| configure("configuring GCS", e))?,
            );
            if let Some(bucket_url) = crate::listing_urls::gcs_bucket_url(&builder, &store) {
                raw_lister = Some(Arc::new(
                    RawLister::gcs(
                        bucket_url,
                        Arc::clone(store.credentials()),
                        (&http_connector(&shared, &stalls), &retry),
                    )
                    .map_err(|e| configure("configuring GCS", e))?,
                ));
            }
            (store.clone(), Some(store))
        }
        #[cfg(feature = "azure")]
        ObjectStoreScheme::MicrosoftAzure => {
            use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
            let mut builder = MicrosoftAzureBuilder::from_env()
                .with_url(url)
                .with_retry(retry.clone());
            for (key, value) in options {
                let key: AzureConfigKey =
                    key.parse().map_err(|e| configure("bad Azure option", e))?;
                builder = builder.with_config(key, value);
            }
            let endpoint = builder.get_config_value(&AzureConfigKey::Endpoint);
            let emulator = builder
                .get_config_value(&AzureConfigKey::UseEmulator)
                .is_some_and(|on| on == "true");
            let name = endpoint.as_deref().or(emulator.then_some("emulator"));
            let shared = Throttle::shared(&store_name(&parsed, name));
            builder = builder.with_http_connector(http_connector(&shared, &stalls));
            throttle = Some(Arc::clone(&shared));
            local = emulator || endpoint.is_some_and(|endpoint| is_loopback(&endpoint));
            let store = Arc::new(
                builder
                    .clone()
                    .build()
                    .map_err(|e| configure("configuring Azure", e))?,
            );
            if let Some((url, account)) = crate::listing_urls::azure_container_url(&builder, &store)
            {
                raw_lister = Some(Arc::new(
                    RawLister::azure(
                        url,
                        account,
                        Arc::clone(store.credentials()),
                        (&http_connector(&shared, &stalls), &retry),
                    )
                    .map_err(|e| configure("configuring Azure", e))?,
                ));
            }
            (store.clone(), Some(store))
        }
        ObjectStoreScheme::Local => {
            (durable, local) = (false, true);
            // Local files have no multipart ids: a killed writer's upload is a scratch file
            // object_store leaves beside the key.
            (Arc::new(object_store::local::LocalFileSystem::new()), None)
        }
        ObjectStoreScheme::Memory => {
            (durable, local) = (false, true);
            let store = Arc::new(object_store::memory::InMemory::new());
            (store.clone(), Some(store))
        }
        other => {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "{other:?} stores are not supported (weightbay-object-store has the features \
                     aws, gcp and azure for S3, GCS and Azure)"
                ),
            )
            .with_key(url));
        }
    };
    let defaults = ObjectStoreOptions::DEFAULT;
    let options = defaults
        .with_durable(durable)
        .with_stall_detection(stall_detection)
        .with_fetch_request_len(
            fetch_request_len.unwrap_or(defaults.fetch_request_len.filter(|_| !local)),
        );
    let mut storage = ObjectStorage::new(store)?;
    storage.multipart = multipart;
    storage.raw_lister = raw_lister;
    let mut storage = storage.with_prefix(prefix.as_ref())?.with_options(options);
    if let Some(throttle) = throttle {
        storage = storage.with_throttle(throttle);
        #[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
        {
            storage = storage.with_stall_watch(stalls);
        }
    }
    Ok(storage)
}

/// One option of [`open_url`]: its key and value.
type Setting = (String, String);

/// The options of [`open_url`] that are weightbay's rather than object_store's.
const OPTION_PREFIX: &str = "weightbay_";

/// The names of this crate's options: stall detection's (`weightbay_stall_detection` = `on`/
/// `off`, `weightbay_stall_floor_secs`, `weightbay_stall_factor`,
/// `weightbay_stall_min_body_rate`, `weightbay_hedged_reads_percent`), then
/// `weightbay_fetch_request_len` (bytes, or `whole`).
const OWN_OPTIONS: [&str; 6] = [
    "weightbay_stall_detection",
    "weightbay_stall_floor_secs",
    "weightbay_stall_factor",
    "weightbay_stall_min_body_rate",
    "weightbay_hedged_reads_percent",
    "weightbay_fetch_request_len",
];

/// What this crate's options set.
#[derive(Debug, PartialEq)]
struct OwnOptions {
    stall_detection: Option<StallDetection>,
    /// [`ObjectStoreOptions::fetch_request_len`] when given (`whole`: `Some(None)`); `None`
    /// leaves it to where the store runs.
    fetch_request_len: Option<Option<u64>>,
}

/// This crate's options as `options` or else the environment (the same names in capitals)
/// set them, from [`StallDetection::DEFAULT`].
fn own_options(options: &[Setting], env: &dyn Fn(&str) -> Option<String>) -> Result<OwnOptions> {
    if let Some((unknown, _)) = options.iter().find(|(key, _)| {
        !OWN_OPTIONS
            .iter()
            .any(|name| key.eq_ignore_ascii_case(name))
    }) {
        return Err(Error::invalid(format!(
            "unknown option `{unknown}` (weightbay's are {})",
            OWN_OPTIONS.join(", ")
        )));
    }
    let setting = |name: &str| {
        options
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.trim().to_owned())
            .or_else(|| env(&name.to_ascii_uppercase()))
    };
    let [switch, floor, factor, rate, hedged, request_len] = OWN_OPTIONS;
    let fetch_request_len = match setting(request_len) {
        None => None,
        Some(value) if value.eq_ignore_ascii_case("whole") => Some(None),
        Some(value) => Some(Some(
            value
                .parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| bad_option(request_len, &value, "a length in bytes, or `whole`"))?,
        )),
    };
    let stall_detection = match setting(switch).as_deref() {
        None | Some("on" | "true" | "1") => {
            let mut settings = StallDetection::DEFAULT;
            if let Some(value) = setting(floor) {
                settings.floor = value
                    .parse::<f64>()
                    .ok()
                    .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
                    .ok_or_else(|| bad_option(floor, &value, "seconds"))?;
            }
            if let Some(value) = setting(factor) {
                settings.factor = value
                    .parse::<u32>()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| bad_option(factor, &value, "a whole number, 1 or more"))?;
            }
            if let Some(value) = setting(rate) {
                settings.min_body_rate = value
                    .parse::<u64>()
                    .map_err(|_| bad_option(rate, &value, "bytes a second"))?;
            }
            if let Some(value) = setting(hedged) {
                settings.hedged_reads_percent = value
                    .parse::<u32>()
                    .ok()
                    .filter(|&percent| percent <= 100)
                    .ok_or_else(|| bad_option(hedged, &value, "a percentage, 0 to 100"))?;
            }
            Some(settings)
        }
        Some("off" | "false" | "0") => None,
        Some(other) => return Err(bad_option(switch, other, "`on` or `off`")),
    };
    Ok(OwnOptions {
        stall_detection,
        fetch_request_len,
    })
}

/// The error for option `name` set to a `value` it does not take.
fn bad_option(name: &str, value: &str, wanted: &str) -> Error {
    Error::invalid(format!("`{name}` is `{value}`; it takes {wanted}"))
}

/// The name a store's shared [`Throttle`] goes by: scheme, bucket and endpoint.
fn store_name(url: &url::Url, endpoint: Option<&str>) -> String {
    format!(
        "{}://{}@{}",
        url.scheme(),
        url.host_str().unwrap_or_default(),
        endpoint.unwrap_or("default")
    )
}

/// Whether `endpoint` (a URL) names this machine.
fn is_loopback(endpoint: &str) -> bool {
    match url::Url::parse(endpoint)
        .ok()
        .and_then(|url| url.host().map(|h| h.to_owned()))
    {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(options: &[(&str, &str)], env: &[(&str, &str)]) -> Result<OwnOptions> {
        let options: Vec<Setting> = options
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let env = |name: &str| {
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        };
        own_options(&options, &env)
    }

    #[test]
    fn nothing_given_leaves_the_defaults() {
        let own = parsed(&[], &[]).expect("no options");
        assert_eq!(own.stall_detection, Some(StallDetection::DEFAULT));
        assert_eq!(own.fetch_request_len, None);
    }

    #[test]
    fn the_fetch_request_len_is_bytes_or_whole_from_an_option_or_the_environment() {
        let own = parsed(&[("weightbay_fetch_request_len", "16777216")], &[]).expect("bytes");
        assert_eq!(own.fetch_request_len, Some(Some(16 << 20)));
        let own = parsed(&[("WEIGHTBAY_FETCH_REQUEST_LEN", "whole")], &[]).expect("whole");
        assert_eq!(own.fetch_request_len, Some(None));
        let own = parsed(&[], &[("WEIGHTBAY_FETCH_REQUEST_LEN", "4096")]).expect("variable");
        assert_eq!(own.fetch_request_len, Some(Some(4096)));
        // The option wins over the variable.
        let own = parsed(
            &[("weightbay_fetch_request_len", "whole")],
            &[("WEIGHTBAY_FETCH_REQUEST_LEN", "4096")],
        )
        .expect("both");
        assert_eq!(own.fetch_request_len, Some(None));
        for bad in ["0", "-1", "16MiB", ""] {
            let error =
                parsed(&[("weightbay_fetch_request_len", bad)], &[]).expect_err("not a length");
            assert!(
                error.to_string().contains("weightbay_fetch_request_len"),
                "{error}"
            );
        }
    }

    #[test]
    fn stall_detection_is_turned_off_or_tuned_and_unknown_options_are_named() {
        let own = parsed(&[], &[("WEIGHTBAY_STALL_DETECTION", "off")]).expect("off");
        assert_eq!(own.stall_detection, None);
        let own = parsed(&[("weightbay_stall_factor", "8")], &[]).expect("factor");
        assert_eq!(own.stall_detection.map(|s| s.factor), Some(8));
        let error = parsed(&[("weightbay_stall_factor", "0")], &[]).expect_err("factor 0");
        assert!(
            error.to_string().contains("weightbay_stall_factor"),
            "{error}"
        );
        let error = parsed(&[("weightbay_fetch_len", "1")], &[]).expect_err("unknown");
        assert!(error.to_string().contains("weightbay_fetch_len"), "{error}");
    }
}
