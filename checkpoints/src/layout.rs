//! Where a checkpoint's files lie under the run's prefix: one directory per step, the commit
//! record in it, rank manifests in `ranks/`. Every key the crate reads or writes is spelled
//! here and parsed back here, so the layout in docs/FORMAT.md has one implementation.
//!
//! ```text
//! <prefix>/step-<n>/commit.json                          the commit record, written last
//! <prefix>/step-<n>/<save>/…                             one save's containers
//! <prefix>/step-<n>/ranks/rank-<rank>-of-<world>.json    a rank's manifest
//! <prefix>/step-<n>/ranks/committer                      the commit intent
//! <prefix>/step-<n>/ranks/rank-<rank>-of-<world>.failed.json   why a rank failed
//! <prefix>/refs/step-<n>-<save>.json                     what an incremental save refers to
//! ```

/// The directory under the run's prefix where saves announce the containers they will refer
/// to (`refs/step-<n>-<save>.json`).
pub(crate) const ANNOUNCEMENTS_DIR: &str = "refs";

/// The commit record's name inside a step's directory.
pub const COMMIT_RECORD: &str = "commit.json";
/// The directory of a step's rank manifests.
pub const RANKS_DIR: &str = "ranks";
/// The commit intent's name in [`RANKS_DIR`]: created (create-new) by the one rank that goes
/// on to read the manifests and commit.
pub(crate) const COMMIT_INTENT: &str = "committer";

/// The directory of `step` under `prefix` (empty for the storage's top level).
pub(crate) fn step_dir(prefix: &str, step: u64) -> String {
    under(prefix, &format!("step-{step}"))
}

/// `prefix/<rest>`, or `rest` for the storage's top level.
pub(crate) fn under(prefix: &str, rest: &str) -> String {
    if prefix.is_empty() {
        rest.to_owned()
    } else {
        format!("{prefix}/{rest}")
    }
}

/// `key` relative to `prefix` (as pieces name the containers they lie in); `key` itself when
/// it is not under it.
pub(crate) fn relative<'k>(prefix: &str, key: &'k str) -> &'k str {
    if prefix.is_empty() {
        return key;
    }
    key.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(key)
}

/// The directory of announcements under `prefix`.
pub(crate) fn announcements_dir(prefix: &str) -> String {
    under(prefix, ANNOUNCEMENTS_DIR)
}

/// The key of the announcement of save `token` of `step`.
pub(crate) fn announcement_key(prefix: &str, step: u64, token: &str) -> String {
    format!("{}/step-{step}-{token}.json", announcements_dir(prefix))
}

/// The token of save directory `save_dir` (`<step dir>/<token>`): its last segment.
pub(crate) fn save_token(save_dir: &str) -> &str {
    save_dir.rsplit('/').next().unwrap_or(save_dir)
}

/// The step and save token an announcement's key under `prefix` names, if it is one.
pub(crate) fn parse_announcement_key(prefix: &str, key: &str) -> Option<(u64, String)> {
    let name = key
        .strip_prefix(&announcements_dir(prefix))?
        .strip_prefix("/step-")?
        .strip_suffix(".json")?;
    let (step, token) = name.split_once('-')?;
    let step: u64 = step.parse().ok()?;
    (announcement_key(prefix, step, token) == key).then(|| (step, token.to_owned()))
}

/// The key `key` (relative to its step directory, in save directory `<token>/`, or at the top)
/// takes in save directory `save` of a copy.
pub(crate) fn moved_into(save: &str, key: &str) -> String {
    match key.split_once('/') {
        Some((_, rest)) => format!("{save}/{rest}"),
        None => format!("{save}/{key}"),
    }
}

/// The key of the commit record in step directory `dir`.
pub(crate) fn record_key(dir: &str) -> String {
    format!("{dir}/{COMMIT_RECORD}")
}

/// The key of the commit intent in step directory `dir`.
pub(crate) fn intent_key(dir: &str) -> String {
    format!("{dir}/{RANKS_DIR}/{COMMIT_INTENT}")
}

/// The step whose directory under `prefix` holds `key`, if `key` lies in one. Only the
/// canonical spelling counts (`step-7`, not `step-07`), so one step has one directory.
pub(crate) fn step_of(prefix: &str, key: &str) -> Option<u64> {
    let rest = if prefix.is_empty() {
        key
    } else {
        key.strip_prefix(prefix)?.strip_prefix('/')?
    };
    let (dir, _) = rest.split_once('/')?;
    let digits = dir.strip_prefix("step-")?;
    let step: u64 = digits.parse().ok()?;
    (step.to_string() == digits).then_some(step)
}

/// The key of `rank`'s manifest in step directory `dir`.
pub(crate) fn manifest_key(dir: &str, rank: u32, world_size: u32) -> String {
    format!("{dir}/{RANKS_DIR}/rank-{rank:05}-of-{world_size:05}.json")
}

/// The key of `rank`'s failure record in step directory `dir`.
pub(crate) fn failure_key(dir: &str, rank: u32, world_size: u32) -> String {
    format!("{dir}/{RANKS_DIR}/rank-{rank:05}-of-{world_size:05}.failed.json")
}

/// The rank and world size a failure record's key in `dir` names, if it is one.
pub(crate) fn parse_failure_key(dir: &str, key: &str) -> Option<(u32, u32)> {
    let manifest = format!("{}.json", key.strip_suffix(".failed.json")?);
    let parsed = parse_manifest_key(dir, &manifest)?;
    (failure_key(dir, parsed.0, parsed.1) == key).then_some(parsed)
}

/// The rank and world size a manifest key in `dir` names, if it is one.
pub(crate) fn parse_manifest_key(dir: &str, key: &str) -> Option<(u32, u32)> {
    let name = key
        .strip_prefix(dir)?
        .strip_prefix('/')?
        .strip_prefix(RANKS_DIR)?
        .strip_prefix("/rank-")?
        .strip_suffix(".json")?;
    let (rank, world_size) = name.split_once("-of-")?;
    let (rank, world_size): (u32, u32) = (rank.parse().ok()?, world_size.parse().ok()?);
    (manifest_key(dir, rank, world_size) == key && rank < world_size).then_some((rank, world_size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_keys_parse_back_and_nothing_else_does() {
        let key = manifest_key("run/step-7", 3, 12);
        assert_eq!(key, "run/step-7/ranks/rank-00003-of-00012.json");
        assert_eq!(parse_manifest_key("run/step-7", &key), Some((3, 12)));
        let failure = failure_key("run/step-7", 3, 12);
        assert_eq!(parse_failure_key("run/step-7", &failure), Some((3, 12)));
        assert_eq!(parse_manifest_key("run/step-7", &failure), None);
        assert_eq!(parse_failure_key("run/step-7", &key), None);
        for other in [
            "run/step-7/ranks/rank-3-of-12.json",
            "run/step-7/ranks/rank-00012-of-00012.json",
            "run/step-7/x/rank-00003-of-00012.json",
            "run/step-70/ranks/rank-00003-of-00012.json",
        ] {
            assert_eq!(parse_manifest_key("run/step-7", other), None, "{other}");
        }
    }

    #[test]
    fn announcement_keys_parse_back() {
        let key = announcement_key("run", 12, "77-3-ab");
        assert_eq!(key, "run/refs/step-12-77-3-ab.json");
        assert_eq!(
            parse_announcement_key("run", &key),
            Some((12, "77-3-ab".into()))
        );
        assert_eq!(
            parse_announcement_key("", "refs/step-1-x.json"),
            Some((1, "x".into()))
        );
        for other in [
            "run/refs/step-012-x.json",
            "run/refs/x.json",
            "runs/refs/step-1-x.json",
        ] {
            assert_eq!(parse_announcement_key("run", other), None, "{other}");
        }
    }

    #[test]
    fn steps_have_one_spelling() {
        assert_eq!(step_of("run", "run/step-7/commit.json"), Some(7));
        assert_eq!(step_of("", "step-7/x/model.bpk"), Some(7));
        for other in [
            "run/step-07/commit.json",
            "run/step-7",
            "runs/step-7/commit.json",
            "run/x/step-7/commit.json",
        ] {
            assert_eq!(step_of("run", other), None, "{other}");
        }
    }
}
