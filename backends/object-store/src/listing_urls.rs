//! Where a GCS or Azure store sends its listings, for the raw listings of `raw_lister.rs`:
//! derived from the configured builder and the built store as `object_store` 0.14 derives
//! them, which keeps no public accessor for either.

#[cfg(feature = "gcp")]
use object_store::gcp::{GoogleCloudStorage, GoogleCloudStorageBuilder, GoogleConfigKey};

#[cfg(feature = "azure")]
use object_store::azure::{AzureConfigKey, MicrosoftAzure, MicrosoftAzureBuilder};

/// GCS's base URL where neither the options nor the service account name another.
#[cfg(feature = "gcp")]
const GCS_BASE_URL: &str = "https://storage.googleapis.com";

/// The URL of `store`'s bucket: `{base URL}/{bucket}`, the base URL being the option
/// `google_base_url`, else the service account's `gcs_base_url` (what an emulator's
/// account file sets), else GCS's own.
#[cfg(feature = "gcp")]
pub(crate) fn gcs_bucket_url(
    builder: &GoogleCloudStorageBuilder,
    store: &GoogleCloudStorage,
) -> Option<String> {
    let account = || -> Option<serde_json::Value> {
        let text = match builder.get_config_value(&GoogleConfigKey::ServiceAccountKey) {
            Some(key) => key,
            None => {
                std::fs::read_to_string(builder.get_config_value(&GoogleConfigKey::ServiceAccount)?)
                    .ok()?
            }
        };
        serde_json::from_str(&text).ok()
    };
    let base = builder
        .get_config_value(&GoogleConfigKey::BaseUrl)
        .or_else(|| Some(account()?.get("gcs_base_url")?.as_str()?.to_owned()))
        .unwrap_or_else(|| GCS_BASE_URL.to_owned());
    // `GoogleCloudStorage(bucket)`.
    let bucket = store
        .to_string()
        .strip_prefix("GoogleCloudStorage(")?
        .strip_suffix(')')?
        .to_owned();
    Some(format!("{}/{bucket}", base.trim_end_matches('/')))
}

/// The URL of `store`'s container and its account: the emulator's (`AZURITE_BLOB_STORAGE_URL`,
/// else `http://127.0.0.1:10000`, then the account), else the option
/// `azure_storage_endpoint`, else the account's endpoint in Azure's public cloud. `None`
/// for what this does not derive (Fabric endpoints): such a store's listings are not redone.
#[cfg(feature = "azure")]
pub(crate) fn azure_container_url(
    builder: &MicrosoftAzureBuilder,
    store: &MicrosoftAzure,
) -> Option<(String, String)> {
    let fabric = builder
        .get_config_value(&AzureConfigKey::UseFabricEndpoint)
        .is_some_and(|on| on == "true");
    let emulator = builder
        .get_config_value(&AzureConfigKey::UseEmulator)
        .is_some_and(|on| on == "true");
    // `MicrosoftAzure { account: a, container: c }`.
    let shown = store.to_string();
    let (account, container) = shown
        .strip_prefix("MicrosoftAzure { account: ")?
        .strip_suffix(" }")?
        .split_once(", container: ")?;
    let service = if emulator {
        let url = std::env::var("AZURITE_BLOB_STORAGE_URL")
            .unwrap_or_else(|_| "http://127.0.0.1:10000".to_owned());
        format!("{}/{account}", url.trim_end_matches('/'))
    } else if fabric || account.contains('.') {
        // A Fabric workspace's account is `{workspace}.z{xy}`, which only its URL names.
        return None;
    } else {
        builder
            .get_config_value(&AzureConfigKey::Endpoint)
            .unwrap_or_else(|| format!("https://{account}.blob.core.windows.net"))
    };
    Some((
        format!("{}/{container}", service.trim_end_matches('/')),
        account.to_owned(),
    ))
}
