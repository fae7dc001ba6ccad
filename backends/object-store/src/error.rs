//! From `object_store` errors to weightbay's, keeping the store's message.

use weightbay::{Error, ErrorKind};

use crate::stall::Stalled;

/// Converts an `object_store` error, naming what was being done.
pub(crate) fn convert(what: impl Into<String>, error: object_store::Error) -> Error {
    let kind =
        match &error {
            object_store::Error::NotFound { .. } => ErrorKind::NotFound,
            object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. } => ErrorKind::AlreadyExists,
            object_store::Error::NotSupported { .. }
            | object_store::Error::NotImplemented { .. } => ErrorKind::Unsupported,
            object_store::Error::InvalidPath { .. }
            | object_store::Error::UnknownConfigurationKey { .. } => ErrorKind::InvalidInput,
            _ => ErrorKind::Io,
        };
    if let Some(hint) = missing_credentials(&error) {
        return Error::new(ErrorKind::InvalidInput, hint).with_source(error);
    }
    let what = what.into();
    match transport_failure(&error) {
        Some(how) => Error::new(kind, format!("{what}: {how}")).with_source(error),
        None => Error::new(kind, what).with_source(error),
    }
}

/// Whether a request failed in transport (its answer lost, or never come) rather than by the
/// store's refusal: it may have been carried out, and may be tried again.
pub(crate) fn answer_lost(error: &object_store::Error) -> bool {
    transport_failure(error).is_some()
}

/// How a request failed in transport, in words, when it did: object_store's own text then
/// says "error sending request" for a request that timed out, which hides that the store
/// never answered.
fn transport_failure(error: &object_store::Error) -> Option<String> {
    use object_store::client::{HttpError, HttpErrorKind};
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if let Some(http) = error.downcast_ref::<HttpError>() {
            let stalled = std::error::Error::source(http).and_then(|e| e.downcast_ref::<Stalled>());
            if let Some(stalled) = stalled {
                return Some(format!(
                    "{stalled}; stall detection cut the request (ObjectStoreOptions::stall_detection) \
                     and the retries ran out"
                ));
            }
            let how = match http.kind() {
                HttpErrorKind::Timeout => {
                    "the store did not answer within the request timeout (object_store's \
                     `timeout`, 30 s unless set)"
                }
                HttpErrorKind::Connect => "the store could not be reached",
                HttpErrorKind::Interrupted => "the connection was cut mid-request",
                _ => "the request or its answer was lost in transport",
            };
            return Some(how.to_owned());
        }
        cause = error.source();
    }
    None
}

/// What to say when a store found no credentials in the environment and fell back on the
/// cloud's instance-metadata endpoint, which failed: object_store's own message names only
/// that call (`PUT http://169.254.169.254/latest/api/token`), which tells a user off the cloud
/// nothing about what to set.
fn missing_credentials(error: &object_store::Error) -> Option<String> {
    let object_store::Error::Generic { store, source } = error else {
        return None;
    };
    // The paths of the instance-metadata credential calls (EC2's IMDS, GCE's metadata
    // server, Azure's managed identity), wherever their endpoint was pointed.
    const METADATA_CALLS: [&str; 4] = [
        "/latest/api/token",
        "/latest/meta-data/iam",
        "/computeMetadata/v1/",
        "/metadata/identity/oauth2/token",
    ];
    let text = source.to_string();
    if !METADATA_CALLS.iter().any(|call| text.contains(call)) {
        return None;
    }
    let read = match *store {
        "S3" => {
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary \
             ones), then the profile AWS_PROFILE names (`default` without it) in \
             ~/.aws/credentials and ~/.aws/config (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE): \
             its aws_access_key_id and aws_secret_access_key, or its credential_process (SSO and \
             assumed-role profiles are not read), then AWS_WEB_IDENTITY_TOKEN_FILE with \
             AWS_ROLE_ARN, or AWS_CONTAINER_CREDENTIALS_RELATIVE_URI / \
             AWS_CONTAINER_CREDENTIALS_FULL_URI"
        }
        "GCS" => {
            "GOOGLE_SERVICE_ACCOUNT (or GOOGLE_SERVICE_ACCOUNT_PATH, GOOGLE_APPLICATION_CREDENTIALS) \
             naming a service-account JSON file, or GOOGLE_SERVICE_ACCOUNT_KEY holding one, or \
             the application-default credentials of `gcloud auth application-default login` \
             (~/.config/gcloud/application_default_credentials.json)"
        }
        "MicrosoftAzure" => {
            "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY, or AZURE_STORAGE_SAS_KEY, \
             or AZURE_CLIENT_ID, AZURE_CLIENT_SECRET and AZURE_TENANT_ID, or AZURE_FEDERATED_TOKEN_FILE"
        }
        _ => return None,
    };
    Some(format!(
        "no {store} credentials found: weightbay (through object_store) reads {read}. With none \
         of them set it asks the cloud's instance-metadata endpoint, which only answers on a \
         cloud machine, and that failed"
    ))
}
