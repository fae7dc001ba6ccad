//! Export to the Hugging Face layout: the tensors of any checkpoint, container or sharded set
//! as `model-0000k-of-0000N.safetensors` shards and `model.safetensors.index.json`, which
//! transformers, candle and vLLM load. Each shard streams: tensors are read in pieces, many at
//! once ahead of the writer, each assembled from the rank slices that hold it, so memory is a
//! budget of pieces, not the largest tensor. The index is written last, with create-new:
//! until it exists the directory holds no loadable model, so an export killed at any moment
//! leaves nothing a loader takes for complete, and a rerun finishes it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use weightbay::checksum::crc32c_append;
use weightbay::{
    AccessPolicy, CreateOptions, DType, Durability, Error, ErrorKind, Format, Reader, Result,
    SHARD_CHECKSUMS_KEY, ShardChecksum, ShardedWeights, Storage, StorageExt, Tensor, WriteMode,
    Writer,
};

use crate::assembled_bytes::assembled_bytes;
use crate::checkpoint::Checkpoint;
use crate::committed_containers::Recording;
use crate::converted::converted;
use crate::record::Region;
use crate::tensors_ahead::TensorsAhead;

/// The index's name, as transformers' `save_pretrained` writes it.
pub const EXPORT_INDEX: &str = "model.safetensors.index.json";

/// Bytes read ahead of the piece being written, at most: the export's memory is this, the
/// piece it writes and the writer's buffers, whatever the size of its tensors (a tensor whose
/// bytes are resident already, as a source's batched read hands them, is held whole).
const READ_AHEAD: u64 = 64 << 20;

/// The pieces tensors are read in: sixteen of them fill [`READ_AHEAD`], each one request.
const PIECE_LEN: u64 = 4 << 20;

/// The name transformers gives tied output embeddings, which it leaves out of what it saves
/// when the model's config says `tie_word_embeddings`.
const LM_HEAD: &str = "lm_head.weight";

/// What an export writes and how: shard size, dtype, which tensors under which names, ties,
/// alignment, and files that travel with the model.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    max_shard_size: u64,
    dtype: Option<DType>,
    include: Vec<String>,
    exclude: Vec<String>,
    renames: Vec<(String, String)>,
    ties: Vec<(String, String)>,
    tie_lm_head: bool,
    alignment: Option<u64>,
    files: Vec<(String, Vec<u8>)>,
    overwrite: bool,
    durability: Durability,
    cancel: Option<Arc<AtomicBool>>,
}

impl Default for ExportOptions {
    fn default() -> Self {
        Self {
            max_shard_size: 5_000_000_000,
            dtype: None,
            include: Vec::new(),
            exclude: Vec::new(),
            renames: Vec::new(),
            ties: Vec::new(),
            tie_lm_head: false,
            alignment: None,
            files: Vec::new(),
            overwrite: false,
            durability: Durability::Default,
            cancel: None,
        }
    }
}

impl ExportOptions {
    /// The most tensor bytes in one shard (5 GB by default, as transformers'
    /// `save_pretrained`); a larger tensor gets a shard of its own.
    #[must_use]
    pub fn with_max_shard_size(mut self, bytes: u64) -> Self {
        self.max_shard_size = bytes;
        self
    }

    /// Floating-point tensors (F64, F32, F16, BF16) converted to `dtype` (one of those four)
    /// on the way, rounding to nearest even with the bits torch's casts give; other tensors
    /// are written as they are.
    #[must_use]
    pub fn with_dtype(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// Exports only tensors whose stored name matches one of these patterns (`*` any run of
    /// characters, `?` one), when any is given.
    #[must_use]
    pub fn including(mut self, pattern: impl Into<String>) -> Self {
        self.include.push(pattern.into());
        self
    }

    /// Leaves out tensors whose stored name matches this pattern (as
    /// [`including`](Self::including)), whatever they match there.
    #[must_use]
    pub fn excluding(mut self, pattern: impl Into<String>) -> Self {
        self.exclude.push(pattern.into());
        self
    }

    /// A stored name that starts with `from` is exported with `to` in its place (the first
    /// rename that matches, in the order given).
    #[must_use]
    pub fn renaming(mut self, from: impl Into<String>, to: impl Into<String>) -> Self {
        self.renames.push((from.into(), to.into()));
        self
    }

    /// `dropped` (an exported name) is written once, as `kept`: it is left out, after its
    /// bytes are checked to equal `kept`'s, as transformers saves tied weights.
    #[must_use]
    pub fn tying(mut self, dropped: impl Into<String>, kept: impl Into<String>) -> Self {
        self.ties.push((dropped.into(), kept.into()));
        self
    }

    /// `lm_head.weight` is left out when another exported tensor of its dtype and shape holds
    /// the same bytes: what transformers does for a config with `tie_word_embeddings`.
    #[must_use]
    pub fn tying_lm_head(mut self) -> Self {
        self.tie_lm_head = true;
        self
    }

    /// Each shard's tensor data starts on a multiple of `alignment` (a power of two, at least
    /// 8). safetensors forbids gaps between tensors, so within a shard the tensors whose byte
    /// length is a multiple of `alignment` come first, and every one of them starts aligned;
    /// the others follow them, and start wherever the ones before them end.
    #[must_use]
    pub fn with_alignment(mut self, alignment: u64) -> Self {
        self.alignment = Some(alignment);
        self
    }

    /// A file that travels with the model (`config.json`, tokenizer files), written under
    /// `name` beside the shards before the index.
    #[must_use]
    pub fn with_file(mut self, name: impl Into<String>, bytes: Vec<u8>) -> Self {
        self.files.push((name.into(), bytes));
        self
    }

    /// Replaces an export already at the destination: its index is deleted first, so the
    /// directory is never a loadable mix of the two.
    #[must_use]
    pub fn overwriting(mut self) -> Self {
        self.overwrite = true;
        self
    }

    /// The durability of every file written ([`Durability::Durable`] for local disks).
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Stops the export at its next write once `cancel` is set; no index is written.
    #[must_use]
    pub fn with_cancel(mut self, cancel: Arc<AtomicBool>) -> Self {
        self.cancel = Some(cancel);
        self
    }
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExportSummary {
    /// The index's key: the export's commit point.
    pub index: String,
    /// The shards' keys, in order.
    pub shards: Vec<String>,
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data in all shards (the index's `total_size`).
    pub total_size: u64,
    /// Each tie applied: the name left out, and the name whose bytes it shares.
    pub tied: Vec<(String, String)>,
    /// Tensors whose data starts on the asked alignment (all of them without one).
    pub aligned: usize,
    /// Unfinished writes of dead writers (a killed export's scratch files or uploads) removed
    /// from the directory once the index was written.
    pub cleaned: usize,
}

impl Checkpoint {
    /// Writes this checkpoint's tensors under `dir` of `storage` in the Hugging Face layout
    /// ([`export_tensors`]), whatever wrote it: one container, shards, incremental pieces, or
    /// ranks whose slices are assembled into whole tensors as each is written.
    ///
    /// # Errors
    /// As [`export_tensors`] and [`Checkpoint::weights`].
    pub fn export(
        &self,
        storage: Arc<dyn Storage>,
        dir: &str,
        options: &ExportOptions,
    ) -> Result<ExportSummary> {
        export_tensors(self.tensors()?, storage, dir, options)
    }

    /// Every tensor of the checkpoint, each read when it is asked for its bytes.
    fn tensors(&self) -> Result<Vec<Tensor>> {
        if self.record.world_size.is_some() {
            let assembled = Arc::new(self.assembled()?);
            let names: Vec<String> = assembled.names().map(str::to_owned).collect();
            return names
                .into_iter()
                .map(|name| {
                    let dtype = assembled.dtype(&name)?;
                    let shape = assembled
                        .tensor(&name)
                        .map(|t| t.shape.clone())
                        .unwrap_or_default();
                    // The record is checked against the stored slices before a shard is
                    // planned or a target allocated: a planted shape fails here, naming it.
                    let whole = Region::whole(&shape);
                    let len = assembled.checked_len(&name, &whole)?;
                    let assembled = Arc::clone(&assembled);
                    let label = name.clone();
                    let size = usize::try_from(len).map_err(|_| {
                        Error::new(ErrorKind::OutOfRange, "does not fit in memory")
                            .with_tensor(&name)
                    })?;
                    // `checked_len` found every slice sliceable, so its dtype has a width.
                    let element_size = dtype.element_size().unwrap_or(1) as usize;
                    let tensor_shape = shape.clone();
                    Ok(Tensor::deferred(name, dtype, shape, len, move || {
                        // Read by range as the writer asks, each from the slices holding it.
                        Ok(assembled_bytes(
                            Arc::clone(&assembled),
                            label.clone(),
                            tensor_shape.clone(),
                            element_size,
                            size,
                        ))
                    }))
                })
                .collect();
        }
        let readers = match &self.record.index {
            Some(index) => {
                let weights = ShardedWeights::open(Arc::clone(&self.storage), &self.key(index))?;
                weights
                    .shard_keys()
                    .iter()
                    .map(|key| Reader::open_key(self.storage.as_ref(), key))
                    .collect::<Result<Vec<_>>>()?
            }
            None => vec![self.reader()?],
        };
        Ok(readers
            .iter()
            .flat_map(|reader| reader.to_writer().tensors().to_vec())
            .collect())
    }
}

/// Writes `tensors` (their stored names, dtypes and bytes; deferred tensors are read as they
/// are written) under `dir` of `storage` in the Hugging Face layout, as `options` say.
///
/// # Errors
/// [`ErrorKind::AlreadyExists`] when `dir` holds an index and `options` do not overwrite;
/// [`ErrorKind::InvalidInput`] for options that contradict the tensors (two exported under one
/// name, a tie whose bytes differ, a filter that leaves nothing); the tensors' and the
/// storage's errors. Nothing is loadable at `dir` unless it succeeds.
pub fn export_tensors(
    tensors: Vec<Tensor>,
    storage: Arc<dyn Storage>,
    dir: &str,
    options: &ExportOptions,
) -> Result<ExportSummary> {
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{}/", dir.trim_end_matches('/'))
    };
    let index = format!("{prefix}{EXPORT_INDEX}");
    let selected = select(tensors, options)?;
    let (selected, tied) = tie(selected, options)?;
    if selected.is_empty() {
        return Err(Error::invalid("the export selects no tensor"));
    }
    // Before a byte is written: an existing export is refused, or made unloadable at once.
    match storage.open(&index) {
        Ok(_) if !options.overwrite => {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                "an export is there already (overwriting replaces it)",
            )
            .with_key(&index));
        }
        Ok(_) => storage.delete(&index)?,
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e.with_key(&index)),
    }
    let groups = shard_groups(selected, options);
    let sizes: Vec<usize> = groups.iter().map(Vec::len).collect();
    let ahead = TensorsAhead::new(
        groups.into_iter().flatten().collect(),
        READ_AHEAD,
        PIECE_LEN,
    );
    let mut taken = ahead.tensors().into_iter();
    let groups: Vec<Vec<Tensor>> = sizes
        .iter()
        .map(|&size| taken.by_ref().take(size).collect())
        .collect();
    let count = groups.len();
    let recording = Recording::new(Arc::clone(&storage));
    let mut weight_map = BTreeMap::new();
    let mut checksums = BTreeMap::new();
    let (mut shards, mut total_size, mut parameters, mut written, mut aligned) =
        (Vec::new(), 0u64, 0u64, 0, 0);
    let write_shards = || -> Result<()> {
        for (number, group) in groups.into_iter().enumerate() {
            let file = format!("model-{:05}-of-{count:05}.safetensors", number + 1);
            let mut offset = 0;
            for tensor in &group {
                weight_map.insert(tensor.name().to_owned(), file.clone());
                total_size += tensor.byte_len();
                parameters += tensor.shape().iter().product::<u64>();
                if options.alignment.is_none_or(|a| offset % a == 0) {
                    aligned += 1;
                }
                offset += tensor.byte_len();
            }
            written += group.len();
            let key = format!("{prefix}{file}");
            // Shards have fixed names, so a rerun overwrites what a killed export left.
            let mut writer = Writer::new(group)
                .with_format(Format::Safetensors)
                .with_metadata("format", "pt")
                .with_mode(WriteMode::Overwrite)
                .with_durability(options.durability);
            if let Some(alignment) = options.alignment {
                writer = writer.with_alignment(alignment);
            }
            if let Some(cancel) = &options.cancel {
                writer = writer.with_cancel(Arc::clone(cancel));
            }
            writer.write_to(&recording, &key)?;
            shards.push(key);
        }
        Ok(())
    };
    std::thread::scope(|scope| {
        for _ in 0..ahead.readers() {
            scope.spawn(|| ahead.read());
        }
        let wrote = write_shards();
        ahead.finish();
        wrote
    })?;
    for (key, len, crc32c) in recording.written() {
        let file = key.strip_prefix(&prefix).unwrap_or(&key).to_owned();
        checksums.insert(file, ShardChecksum { len, crc32c });
    }
    for (name, bytes) in &options.files {
        let overwrite = CreateOptions::default()
            .with_mode(WriteMode::Overwrite)
            .with_durability(options.durability);
        storage.write_whole(&format!("{prefix}{name}"), bytes, overwrite)?;
    }
    let body = serde_json::json!({
        "metadata": {
            "total_size": total_size,
            "total_parameters": parameters,
            SHARD_CHECKSUMS_KEY: checksums,
        },
        "weight_map": weight_map,
    });
    let body = serde_json::to_vec_pretty(&body)
        .map_err(|e| Error::invalid(format!("the export's index: {e}")))?;
    storage.write_new(&index, &body, options.durability)?;
    // What killed exports left in the model's directory (scratch files, unfinished uploads)
    // is no part of the model: removed, best effort, where only dead writers' is. Never at the
    // store's top level, whose listing may be anyone's millions of keys.
    let cleaned = if storage.capabilities().pending_listing && !prefix.is_empty() {
        storage
            .clean_pending(prefix.trim_end_matches('/'))
            .map_or(0, |cleaned| {
                cleaned.iter().filter(|w| w.refused.is_none()).count()
            })
    } else {
        0
    };
    Ok(ExportSummary {
        index,
        shards,
        tensors: written,
        total_size,
        tied,
        aligned,
        cleaned,
    })
}

/// The tensors the filters keep, under their exported names and in their exported dtype, in
/// the order given.
fn select(tensors: Vec<Tensor>, options: &ExportOptions) -> Result<Vec<Tensor>> {
    let mut names = BTreeSet::new();
    let mut selected = Vec::new();
    for tensor in tensors {
        let stored = tensor.name();
        let included =
            options.include.is_empty() || options.include.iter().any(|p| matches(p, stored));
        if !included || options.exclude.iter().any(|p| matches(p, stored)) {
            continue;
        }
        let name = options
            .renames
            .iter()
            .find_map(|(from, to)| Some(format!("{to}{}", stored.strip_prefix(from.as_str())?)))
            .unwrap_or_else(|| stored.to_owned());
        if !names.insert(name.clone()) {
            return Err(Error::invalid(format!(
                "two tensors would be exported as `{name}` (the renames given map them together)"
            )));
        }
        selected.push(converted(tensor, name, options.dtype.as_ref())?);
    }
    Ok(selected)
}

/// A tie: the name left out, and the name whose bytes it shares.
type Tie = (String, String);

/// Applies the ties: each dropped name left out once its bytes are found equal to its kept
/// one's. Returns the tensors left and the ties applied.
fn tie(mut tensors: Vec<Tensor>, options: &ExportOptions) -> Result<(Vec<Tensor>, Vec<Tie>)> {
    let position = |tensors: &[Tensor], name: &str| tensors.iter().position(|t| t.name() == name);
    let mut applied = Vec::new();
    if options.tie_lm_head
        && let Some(head) = position(&tensors, LM_HEAD)
    {
        let crc = crc_of(&tensors[head])?;
        let mut kept = None;
        for other in &tensors {
            if other.name() != LM_HEAD
                && other.dtype() == tensors[head].dtype()
                && other.shape() == tensors[head].shape()
                && crc_of(other)? == crc
            {
                kept = Some(other.name().to_owned());
                break;
            }
        }
        if let Some(kept) = kept {
            tensors.remove(head);
            applied.push((LM_HEAD.to_owned(), kept));
        }
    }
    for (dropped, kept) in options.ties.iter().cloned() {
        let (Some(d), Some(k)) = (position(&tensors, &dropped), position(&tensors, &kept)) else {
            return Err(Error::invalid(format!(
                "tie `{dropped}` to `{kept}`: both must be exported tensors"
            )));
        };
        let same = tensors[d].dtype() == tensors[k].dtype()
            && tensors[d].shape() == tensors[k].shape()
            && crc_of(&tensors[d])? == crc_of(&tensors[k])?;
        if !same {
            return Err(Error::invalid(format!(
                "`{dropped}` is not tied to `{kept}`: their dtypes, shapes or bytes differ"
            )));
        }
        tensors.remove(d);
        applied.push((dropped, kept));
    }
    Ok((tensors, applied))
}

/// The CRC32C of a tensor's bytes, read for it.
fn crc_of(tensor: &Tensor) -> Result<u32> {
    let bytes = tensor.bytes()?;
    Ok(crc32c_append(
        0,
        bytes
            .read(AccessPolicy::AllowCopy)
            .map_err(|e| e.with_tensor(tensor.name()))?,
    ))
}

/// The tensors cut into shards of at most the shard size in bytes, in order (a larger tensor
/// alone), each shard's tensors with lengths a multiple of the alignment first.
fn shard_groups(tensors: Vec<Tensor>, options: &ExportOptions) -> Vec<Vec<Tensor>> {
    let mut groups: Vec<(Vec<Tensor>, u64)> = Vec::new();
    for tensor in tensors {
        let len = tensor.byte_len();
        match groups.last_mut() {
            Some((group, size)) if *size + len <= options.max_shard_size => {
                group.push(tensor);
                *size += len;
            }
            _ => groups.push((vec![tensor], len)),
        }
    }
    groups
        .into_iter()
        .map(|(mut group, _)| {
            if let Some(alignment) = options.alignment {
                // Stable: the order within each kind is kept.
                group.sort_by_key(|t| t.byte_len() % alignment != 0);
            }
            group
        })
        .collect()
}

/// Whether `name` matches the glob `pattern`: `*` any run of characters (dots and slashes
/// included), `?` any one character, anything else itself.
fn matches(pattern: &str, name: &str) -> bool {
    let (pattern, name): (Vec<char>, Vec<char>) =
        (pattern.chars().collect(), name.chars().collect());
    // The last `*` seen, and where in `name` it was tried to end, for backtracking.
    let (mut p, mut n, mut star) = (0, 0, None);
    while n < name.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(&c) if c == '?' || c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((star_p, star_n)) => {
                    p = star_p + 1;
                    n = star_n + 1;
                    star = Some((star_p, star_n + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_shells_do_across_dots() {
        assert!(matches("model.*", "model.layers.0.weight"));
        assert!(matches("*.weight", "model.layers.0.weight"));
        assert!(matches("*layers.?.*", "model.layers.3.bias"));
        assert!(matches("*", ""));
        assert!(!matches("optim.*", "model.optim.x"));
        assert!(!matches("*.bias", "model.weight"));
        assert!(!matches("a?c", "ac"));
        assert!(matches("a*b*c", "aXbYbZc"));
    }
}
