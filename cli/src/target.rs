//! What a location the user names holds: one container, a sharded set (through its
//! `*.index.json`), or the checkpoints of a training run (a prefix with `step-N/` directories
//! under it, see `weightbay::checkpoints`).

use std::sync::Arc;

use weightbay::ShardedWeights;
use weightbay::{Error, ErrorKind, Reader, Result, Tensor};
use weightbay_checkpoints::{Checkpoint, Checkpoints, StepState};
use weightbay_location::Location;

use crate::reach::locate;

/// A location's contents.
pub(crate) enum Target {
    /// One container.
    Container(Reader),
    /// A sharded set: its shards, opened, by key.
    Sharded(Vec<(String, Reader)>),
    /// A training run's checkpoints.
    Checkpoints(Checkpoints),
}

/// Opens what `location` holds. An `*.index.json` is a sharded set; a key with committed
/// containers under it is a checkpoint prefix; anything else is opened as a container, whose
/// error names the formats tried.
pub(crate) fn resolve(location: &Location) -> Result<Target> {
    let in_store = |e: Error| {
        e.context(format_args!(
            "cannot open `{}` in {}",
            location.key, location.store
        ))
    };
    if location.key.ends_with(".index.json") {
        let weights =
            ShardedWeights::open(Arc::clone(&location.storage), &location.key).map_err(in_store)?;
        // An index whose map and shards disagree describes another model: refused whole.
        weights.check_map().map_err(|e| e.with_key(&location.key))?;
        let shards = weights
            .shard_keys()
            .into_iter()
            .map(|key| {
                let reader = Reader::open_key(location.storage.as_ref(), &key)?;
                Ok((key, reader))
            })
            .collect::<Result<_>>()?;
        return Ok(Target::Sharded(shards));
    }
    if location.storage.capabilities().listing
        && !location
            .storage
            .list(&location.key)
            .map_err(in_store)?
            .is_empty()
    {
        return Ok(Target::Checkpoints(Checkpoints::over(
            Arc::clone(&location.storage),
            location.key.clone(),
        )));
    }
    let source = location.storage.open(&location.key).map_err(in_store)?;
    Ok(Target::Container(
        Reader::open(source).map_err(|e| e.with_key(&location.key))?,
    ))
}

/// The tensors of a sharded set, shard after shard, each read when it is written: a copy of
/// the set into one container streams.
pub(crate) fn merged_tensors(shards: &[(String, Reader)]) -> Result<Vec<Tensor>> {
    let mut tensors = Vec::new();
    for (_, reader) in shards {
        tensors.extend(reader.to_tensors()?);
    }
    Ok(tensors)
}

/// The checkpoints a command acts on: `--step N`, `--all` committed ones, or the latest
/// complete one.
pub(crate) fn chosen(checkpoints: &Checkpoints, step: Option<u64>, all: bool) -> Result<Vec<u64>> {
    if let Some(step) = step {
        return Ok(vec![step]);
    }
    if all {
        return Ok(checkpoints
            .list()?
            .into_iter()
            .filter(|s| matches!(s.state, StepState::Complete | StepState::Damaged(_)))
            .map(|s| s.step)
            .collect());
    }
    match checkpoints.latest()? {
        Some(latest) => Ok(vec![latest.step()]),
        None => Err(Error::new(
            ErrorKind::NotFound,
            "no complete checkpoint under this prefix",
        )),
    }
}

/// The one container of `checkpoint` or its shards, opened, by key (an incremental
/// checkpoint's under its pieces' name).
pub(crate) fn containers(checkpoint: &Checkpoint) -> Result<Vec<(String, Reader)>> {
    let record = checkpoint.record();
    let dir = checkpoint.dir();
    // An incremental checkpoint's container is its pieces, wherever they lie.
    if let Some(pieces) = &record.pieces {
        return Ok(vec![(
            format!("{dir}/{}", pieces.name),
            checkpoint.reader()?,
        )]);
    }
    record
        .containers
        .iter()
        .filter(|c| record.index.as_deref() != Some(c.key.as_str()))
        .map(|c| {
            let key = format!("{dir}/{}", c.key);
            let reader = Reader::open_key(checkpoint.storage().as_ref(), &key)?;
            Ok((key, reader))
        })
        .collect()
}

/// `ms` since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub(crate) fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm), valid for every u64 day count here.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// The checkpoints under `url`, which must be able to list.
pub(crate) fn checkpoints_at(url: &str) -> Result<Checkpoints> {
    checkpoints_located(locate(url)?, url)
}

/// [`checkpoints_at`] the location `url` was resolved to, for a caller that keeps the
/// location's stall counts.
pub(crate) fn checkpoints_located(location: Location, url: &str) -> Result<Checkpoints> {
    if !location.storage.capabilities().listing {
        return Err(weightbay::Error::unsupported(format!(
            "{} cannot list, so it holds no checkpoints this command can find",
            location.store
        )));
    }
    // A prefix that does not exist would list as one without checkpoints: say which it is.
    let local = match url.split_once("://") {
        None => Some(url),
        Some(("file", path)) => Some(path),
        Some(_) => None,
    };
    // Unfinished writes count: a prefix whose only upload was killed is one `gc` cleans.
    let missing = match local {
        Some(path) => !std::path::Path::new(path).exists(),
        None => {
            location.storage.list(&location.key)?.is_empty()
                && (!location.storage.capabilities().pending_listing
                    || location.storage.pending(&location.key)?.is_empty())
        }
    };
    if missing {
        let why = if local.is_some() {
            format!("`{url}` does not exist")
        } else {
            format!(
                "nothing is stored under `{url}` (an object-store prefix exists only while \
                 objects are under it)"
            )
        };
        return Err(weightbay::Error::new(weightbay::ErrorKind::NotFound, why));
    }
    Ok(Checkpoints::over(location.storage, location.key))
}
