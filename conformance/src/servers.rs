//! Whether the local test servers are required, and where the S3 one is.

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
    match std::env::var("WEIGHTBAY_S3_URL") {
        Ok(url) => Some(url),
        Err(_) if servers_required() => {
            panic!("WEIGHTBAY_REQUIRE_SERVERS=1 but WEIGHTBAY_S3_URL is unset")
        }
        Err(_) => {
            eprintln!(
                "skipped: no S3 server (vars=$(scripts/servers.sh start s3) && eval \"$vars\")"
            );
            None
        }
    }
}
