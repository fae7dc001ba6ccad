//! Credentials, region and endpoint from the AWS shared files (`~/.aws/credentials` and
//! `~/.aws/config`), where the AWS CLI, boto3, s5cmd and s3torchconnector find them and where
//! most users keep their keys. `object_store` reads only `AWS_*` variables.
//!
//! Each setting is resolved on its own, in the order the AWS SDKs document ("Standardized
//! credential providers" in the SDKs and Tools Reference Guide): what the environment or the
//! URL's options set wins; then the profile `AWS_PROFILE` names (`default` without it), from
//! the credentials file first and the config file after; then what `object_store` finds
//! itself (a web identity token file, container credentials, the instance metadata
//! endpoint). From a profile this reads `aws_access_key_id`, `aws_secret_access_key`,
//! `aws_session_token`, `credential_process` (run with `sh -c` and re-run before its
//! `Expiration`), `region` and `endpoint_url` (skipped under
//! `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true`). It does not support IAM Identity Center (SSO)
//! profiles, assumed roles (`role_arn` with `source_profile` or `credential_source`), or
//! `services` sections: a profile whose only credentials are of those kinds is an error that
//! says so, and names `aws configure export-credentials` as the way around it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, AwsCredential};
use object_store::{ClientConfigKey, CredentialProvider};
use weightbay::{Error, ErrorKind, Result};

/// A credential from `credential_process` is run again this long before it expires.
const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(5 * 60);

/// What one profile of the shared files says, merged from both files.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Profile {
    /// Its settings, the credentials file's over the config file's.
    settings: BTreeMap<String, String>,
}

impl Profile {
    fn get(&self, key: &str) -> Option<&str> {
        self.settings
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// Why this profile's credentials cannot be used here, if they are of a kind weightbay
    /// does not support and it has no other.
    fn unsupported(&self) -> Option<&'static str> {
        if self.get("sso_session").is_some() || self.get("sso_start_url").is_some() {
            Some("IAM Identity Center (SSO) credentials")
        } else if self.get("role_arn").is_some() {
            Some("an assumed role (role_arn)")
        } else {
            None
        }
    }
}

/// The sections of an AWS shared file, by name as written between the brackets, each with
/// its `key = value` settings. Comments (`#`, `;`) and blank lines are skipped, and so are
/// the indented settings of a nested block (`s3 =` followed by indented lines).
fn parse_sections(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut sections: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let nested = line.starts_with([' ', '\t']);
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.trim().to_owned();
            sections.entry(name.clone()).or_default();
            current = Some(name);
            continue;
        }
        if nested {
            continue;
        }
        let (Some(section), Some((key, value))) = (&current, line.split_once('=')) else {
            continue;
        };
        if let Some(settings) = sections.get_mut(section) {
            settings.insert(key.trim().to_ascii_lowercase(), value.trim().to_owned());
        }
    }
    sections
}

/// The files a profile is read from, and which profile.
#[derive(Debug)]
struct Sources {
    name: String,
    /// Whether `AWS_PROFILE` (or `AWS_DEFAULT_PROFILE`) named it.
    named: bool,
    credentials: PathBuf,
    config: PathBuf,
}

impl Sources {
    fn from(env: &dyn Fn(&str) -> Option<String>) -> Option<Self> {
        let home = env("HOME").map(PathBuf::from);
        let file = |variable: &str, default: &str| {
            env(variable)
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|home| home.join(".aws").join(default)))
        };
        let named = env("AWS_PROFILE").or_else(|| env("AWS_DEFAULT_PROFILE"));
        Some(Self {
            named: named.is_some(),
            name: named.unwrap_or_else(|| "default".to_owned()),
            credentials: file("AWS_SHARED_CREDENTIALS_FILE", "credentials")?,
            config: file("AWS_CONFIG_FILE", "config")?,
        })
    }

    /// The profile, or `None` when neither file holds it.
    fn read(&self) -> Result<Option<Profile>> {
        let credentials = read_sections(&self.credentials)?;
        let config = read_sections(&self.config)?;
        let in_config = if self.name == "default" {
            config
                .get("default")
                .or_else(|| config.get("profile default"))
        } else {
            config.get(&format!("profile {}", self.name))
        };
        let in_credentials = credentials.get(&self.name);
        if in_config.is_none() && in_credentials.is_none() {
            return Ok(None);
        }
        let mut settings = in_config.cloned().unwrap_or_default();
        settings.extend(in_credentials.cloned().unwrap_or_default());
        Ok(Some(Profile { settings }))
    }
}

/// The sections of the file at `path`; none when there is no file.
fn read_sections(path: &Path) -> Result<BTreeMap<String, BTreeMap<String, String>>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(parse_sections(&text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(Error::new(ErrorKind::Io, "reading an AWS shared file")
            .with_key(path.display().to_string())
            .with_source(e)),
    }
}

/// Fills in what `builder` (configured from the environment and the caller's options) lacks
/// from the profile of the shared files, as the module's doc says; `env` looks up a variable.
///
/// # Errors
/// [`ErrorKind::InvalidInput`] for a profile `AWS_PROFILE` names that neither file holds, or
/// one whose only credentials are of a kind not supported; [`ErrorKind::Io`] for a file that
/// cannot be read.
pub(crate) fn apply(
    mut builder: AmazonS3Builder,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<AmazonS3Builder> {
    let Some(sources) = Sources::from(env) else {
        return Ok(builder);
    };
    let Some(profile) = sources.read()? else {
        if sources.named {
            return Err(Error::invalid(format!(
                "AWS_PROFILE names the profile `{}`, which neither {} nor {} holds",
                sources.name,
                sources.credentials.display(),
                sources.config.display()
            )));
        }
        return Ok(builder);
    };
    let set = |builder: &AmazonS3Builder, key: AmazonS3ConfigKey| {
        builder
            .get_config_value(&key)
            .is_some_and(|value| !value.is_empty())
    };
    if !set(&builder, AmazonS3ConfigKey::Region)
        && !set(&builder, AmazonS3ConfigKey::DefaultRegion)
        && let Some(region) = profile.get("region")
    {
        builder = builder.with_config(AmazonS3ConfigKey::Region, region);
    }
    let ignore_endpoints =
        env("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if !set(&builder, AmazonS3ConfigKey::Endpoint)
        && !ignore_endpoints
        && let Some(endpoint) = profile.get("endpoint_url")
    {
        builder = builder.with_config(AmazonS3ConfigKey::Endpoint, endpoint);
        // The profile asks for this endpoint by its scheme, as the AWS tools take it.
        if endpoint.starts_with("http://") {
            builder = builder.with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp),
                "true",
            );
        }
    }
    if set(&builder, AmazonS3ConfigKey::AccessKeyId) {
        return Ok(builder);
    }
    if let (Some(key), Some(secret)) = (
        profile.get("aws_access_key_id"),
        profile.get("aws_secret_access_key"),
    ) {
        builder = builder
            .with_config(AmazonS3ConfigKey::AccessKeyId, key)
            .with_config(AmazonS3ConfigKey::SecretAccessKey, secret);
        if let Some(token) = profile.get("aws_session_token") {
            builder = builder.with_config(AmazonS3ConfigKey::Token, token);
        }
        return Ok(builder);
    }
    if let Some(command) = profile.get("credential_process") {
        let process = CredentialProcess {
            profile: sources.name,
            command: command.to_owned(),
            cached: Mutex::default(),
        };
        return Ok(builder.with_credentials(Arc::new(process)));
    }
    let elsewhere = [
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ]
    .iter()
    .any(|variable| env(variable).is_some());
    match profile.unsupported() {
        Some(kind) if !elsewhere => Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "the AWS profile `{}` gives {kind}, which weightbay does not read; run `aws \
                 configure export-credentials --profile {} --format env` and use the variables \
                 it prints, or give the profile aws_access_key_id and aws_secret_access_key or \
                 credential_process",
                sources.name, sources.name
            ),
        )),
        _ => Ok(builder),
    }
}

/// Credentials from a profile's `credential_process`: the command's JSON, cached until shortly
/// before its `Expiration` (for ever without one).
#[derive(Debug)]
struct CredentialProcess {
    profile: String,
    command: String,
    cached: Mutex<Option<(Arc<AwsCredential>, Option<SystemTime>)>>,
}

/// What a credential process prints (the AWS CLI's "Sourcing credentials with an external
/// process" format, version 1).
#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ProcessOutput {
    version: u32,
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
    expiration: Option<String>,
}

impl CredentialProcess {
    /// Runs the command and reads its credentials, naming the profile in every error.
    fn run(&self) -> std::result::Result<(AwsCredential, Option<SystemTime>), String> {
        let output = if cfg!(windows) {
            Command::new("cmd").arg("/C").arg(&self.command).output()
        } else {
            Command::new("sh").arg("-c").arg(&self.command).output()
        }
        .map_err(|e| format!("could not start it: {e}"))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(format!(
                "it exited with {}: {}",
                output.status,
                stderr.trim()
            ));
        }
        let parsed: ProcessOutput = serde_json::from_slice(&output.stdout)
            .map_err(|e| format!("its output is not the JSON credentials expected: {e}"))?;
        if parsed.version != 1 {
            return Err(format!(
                "its output is of Version {}, not 1",
                parsed.version
            ));
        }
        let expires = parsed
            .expiration
            .map(|at| {
                chrono::DateTime::parse_from_rfc3339(&at)
                    .map(SystemTime::from)
                    .map_err(|e| format!("its Expiration `{at}` is not an RFC 3339 time: {e}"))
            })
            .transpose()?;
        let credential = AwsCredential {
            key_id: parsed.access_key_id,
            secret_key: parsed.secret_access_key,
            token: parsed.session_token,
        };
        Ok((credential, expires))
    }
}

#[async_trait::async_trait]
impl CredentialProvider for CredentialProcess {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        let fresh = |expires: &Option<SystemTime>| {
            expires.is_none_or(|at| SystemTime::now() + REFRESH_BEFORE_EXPIRY < at)
        };
        if let Some((credential, expires)) = self
            .cached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            && fresh(expires)
        {
            return Ok(Arc::clone(credential));
        }
        let (credential, expires) = self.run().map_err(|why| object_store::Error::Generic {
            store: "S3",
            source: format!(
                "the credential_process of the AWS profile `{}` failed: {why}",
                self.profile
            )
            .into(),
        })?;
        let credential = Arc::new(credential);
        *self.cached.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((Arc::clone(&credential), expires));
        Ok(credential)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `apply` over files written in a temporary home, with `vars` the environment.
    fn applied(credentials: &str, config: &str, vars: &[(&str, &str)]) -> Result<AmazonS3Builder> {
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".aws")).unwrap();
        std::fs::write(home.path().join(".aws/credentials"), credentials).unwrap();
        std::fs::write(home.path().join(".aws/config"), config).unwrap();
        let home_path = home.path().to_str().unwrap().to_owned();
        let vars: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .chain([("HOME".to_owned(), home_path)])
            .collect();
        apply(AmazonS3Builder::new(), &|name| vars.get(name).cloned())
    }

    fn value(builder: &AmazonS3Builder, key: AmazonS3ConfigKey) -> Option<String> {
        builder.get_config_value(&key)
    }

    const CREDENTIALS: &str = "\
# keys
[default]
aws_access_key_id = AKDEFAULT
aws_secret_access_key = default-secret

[work]
aws_access_key_id=AKWORK
aws_secret_access_key=work-secret
aws_session_token = work-token
";

    const CONFIG: &str = "\
[default]
region = eu-west-1
s3 =
  max_concurrent_requests = 20

[profile work]
region = us-west-2
endpoint_url = http://127.0.0.1:9000
; a comment
";

    #[test]
    fn the_default_profile_gives_keys_and_region() {
        let builder = applied(CREDENTIALS, CONFIG, &[]).unwrap();
        assert_eq!(
            value(&builder, AmazonS3ConfigKey::AccessKeyId).as_deref(),
            Some("AKDEFAULT")
        );
        assert_eq!(
            value(&builder, AmazonS3ConfigKey::Region).as_deref(),
            Some("eu-west-1")
        );
        assert_eq!(value(&builder, AmazonS3ConfigKey::Endpoint), None);
    }

    #[test]
    fn aws_profile_names_the_profile_and_its_endpoint_allows_plain_http() {
        let builder = applied(CREDENTIALS, CONFIG, &[("AWS_PROFILE", "work")]).unwrap();
        assert_eq!(
            value(&builder, AmazonS3ConfigKey::AccessKeyId).as_deref(),
            Some("AKWORK")
        );
        assert_eq!(
            value(&builder, AmazonS3ConfigKey::Token).as_deref(),
            Some("work-token")
        );
        assert_eq!(
            value(&builder, AmazonS3ConfigKey::Region).as_deref(),
            Some("us-west-2")
        );
        assert_eq!(
            value(&builder, AmazonS3ConfigKey::Endpoint).as_deref(),
            Some("http://127.0.0.1:9000")
        );
        assert_eq!(
            value(
                &builder,
                AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp)
            )
            .as_deref(),
            Some("true")
        );
        let ignored = applied(
            CREDENTIALS,
            CONFIG,
            &[
                ("AWS_PROFILE", "work"),
                ("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true"),
            ],
        )
        .unwrap();
        assert_eq!(value(&ignored, AmazonS3ConfigKey::Endpoint), None);
    }

    #[test]
    fn what_is_set_already_wins_over_the_profile() {
        let builder = AmazonS3Builder::new()
            .with_config(AmazonS3ConfigKey::AccessKeyId, "AKENV")
            .with_config(AmazonS3ConfigKey::DefaultRegion, "ap-south-1");
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".aws")).unwrap();
        std::fs::write(home.path().join(".aws/credentials"), CREDENTIALS).unwrap();
        let home_path = home.path().to_str().unwrap().to_owned();
        let builder = apply(builder, &|name| (name == "HOME").then(|| home_path.clone())).unwrap();
        assert_eq!(
            value(&builder, AmazonS3ConfigKey::AccessKeyId).as_deref(),
            Some("AKENV")
        );
        // AWS_DEFAULT_REGION is the region object_store reports; the profile's is not taken.
        assert_eq!(
            value(&builder, AmazonS3ConfigKey::Region).as_deref(),
            Some("ap-south-1")
        );
    }

    #[test]
    fn a_named_profile_that_is_nowhere_and_an_sso_profile_are_errors_that_say_so() {
        let err = applied(CREDENTIALS, CONFIG, &[("AWS_PROFILE", "absent")]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        assert!(err.to_string().contains("`absent`"), "{err}");
        let sso = "[profile corp]\nsso_session = corp\nregion = us-east-1\n";
        let err = applied("", sso, &[("AWS_PROFILE", "corp")]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        assert!(err.to_string().contains("export-credentials"), "{err}");
        // No files and no profile named: nothing to apply, nothing wrong.
        let builder = applied("", "", &[]).unwrap();
        assert_eq!(value(&builder, AmazonS3ConfigKey::AccessKeyId), None);
    }

    #[tokio::test]
    async fn a_credential_process_is_run_and_its_credentials_kept_until_they_expire() {
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("runs");
        let json = |expiration: &str| {
            format!(
                r#"{{"Version": 1, "AccessKeyId": "AKPROC", "SecretAccessKey": "s", "SessionToken": "t"{expiration}}}"#
            )
        };
        for (expiration, runs) in [
            ("", 1),
            (r#", "Expiration": "2999-01-01T00:00:00Z""#, 1),
            (r#", "Expiration": "2000-01-01T00:00:00Z""#, 2),
        ] {
            let _ = std::fs::remove_file(&count);
            let process = CredentialProcess {
                profile: "p".into(),
                command: format!(
                    "echo x >> '{}'; echo '{}'",
                    count.display(),
                    json(expiration)
                ),
                cached: Mutex::default(),
            };
            for _ in 0..2 {
                let credential = process.get_credential().await.unwrap();
                assert_eq!(credential.key_id, "AKPROC");
                assert_eq!(credential.token.as_deref(), Some("t"));
            }
            let ran = std::fs::read_to_string(&count).unwrap().lines().count();
            assert_eq!(ran, runs, "runs with {expiration:?}");
        }
        let failing = CredentialProcess {
            profile: "p".into(),
            command: "echo nope >&2; exit 3".into(),
            cached: Mutex::default(),
        };
        let err = failing.get_credential().await.unwrap_err().to_string();
        assert!(err.contains("`p`") && err.contains("nope"), "{err}");
    }
}
