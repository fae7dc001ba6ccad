//! Merging rank manifests into one commit record: every tensor's slices must agree on dtype
//! and shape and tile it exactly, no overlap and no gap, or the commit is refused naming it.

use std::collections::{BTreeMap, BTreeSet};

use weightbay::{Error, ErrorKind, Result};

use crate::record::{
    CommitRecord, LogicalTensor, MANIFEST_VERSION, RECORD_VERSION, RankManifest, Region,
    SliceRecord, now_unix_ms,
};

/// `error`, as a problem with tensor `name`'s `what`.
pub(crate) fn in_tensor(error: Error, name: &str, what: &str) -> Error {
    Error::invalid(format!("tensor `{name}`: {what}")).with_source(error)
}

/// The commit record `world_size` manifests make, each tensor's slices checked to tile it.
pub(crate) fn merge(
    step: u64,
    world_size: u32,
    manifests: Vec<RankManifest>,
) -> Result<CommitRecord> {
    let mut containers = Vec::new();
    let mut tensors: BTreeMap<String, LogicalTensor> = BTreeMap::new();
    let mut format = None;
    let mut metadata = BTreeMap::new();
    for (rank, manifest) in (0..world_size).zip(manifests) {
        if manifest.weightbay_rank_manifest != MANIFEST_VERSION
            || manifest.step != step
            || manifest.rank != rank
            || manifest.world_size != world_size
        {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "the manifest of rank {rank} of {world_size} for step {step} says rank {} of {} for step {} (version {})",
                    manifest.rank,
                    manifest.world_size,
                    manifest.step,
                    manifest.weightbay_rank_manifest
                ),
            ));
        }
        match &format {
            None => format = Some(manifest.format.clone()),
            Some(f) if *f != manifest.format => {
                return Err(Error::invalid(format!(
                    "rank {rank} wrote {}, rank 0 {f}: a checkpoint has one format",
                    manifest.format
                )));
            }
            Some(_) => {}
        }
        if rank == 0 {
            metadata = manifest.metadata;
        }
        containers.extend(manifest.containers);
        for (name, tensor) in manifest.tensors {
            let logical = tensors
                .entry(name.clone())
                .or_insert_with(|| LogicalTensor {
                    dtype: tensor.dtype.clone(),
                    shape: tensor.shape.clone(),
                    slices: Vec::new(),
                });
            if logical.dtype != tensor.dtype || logical.shape != tensor.shape {
                return Err(Error::invalid(format!(
                    "tensor `{name}`: rank {rank} has it as {} {:?}, an earlier rank as {} {:?}",
                    tensor.dtype, tensor.shape, logical.dtype, logical.shape
                )));
            }
            tensor
                .region
                .within(&tensor.shape)
                .map_err(|e| in_tensor(e, &name, &format!("rank {rank}'s region")))?;
            logical.slices.push(SliceRecord {
                rank,
                container: tensor.container,
                region: tensor.region,
            });
        }
    }
    for (name, logical) in &tensors {
        check_tiling(name, logical)?;
    }
    Ok(CommitRecord {
        weightbay_checkpoint: RECORD_VERSION,
        step,
        time_unix_ms: now_unix_ms(),
        format: format.unwrap_or_default(),
        metadata,
        index: None,
        containers,
        world_size: Some(world_size),
        tensors,
        pieces: None,
    })
}

/// Fails, naming the tensor, unless its slices cover every element exactly once: no two
/// overlap (found by a sweep along the dimension where their starts differ most) and
/// together they hold as many elements as the tensor.
fn check_tiling(name: &str, logical: &LogicalTensor) -> Result<()> {
    let slices = &logical.slices;
    let dims = logical.shape.len();
    let sweep = (0..dims)
        .max_by_key(|&dim| {
            slices
                .iter()
                .map(|s| s.region.offsets[dim])
                .collect::<BTreeSet<_>>()
                .len()
        })
        .unwrap_or(0);
    let mut order: Vec<&SliceRecord> = slices.iter().collect();
    if dims > 0 {
        order.sort_by_key(|s| s.region.offsets[sweep]);
    }
    let mut active: Vec<&SliceRecord> = Vec::new();
    for slice in order {
        if dims > 0 {
            let start = slice.region.offsets[sweep];
            active.retain(|a| a.region.offsets[sweep] + a.region.lengths[sweep] > start);
        }
        if let Some(other) = active
            .iter()
            .find(|a| a.region.intersect(&slice.region).is_some())
        {
            return Err(Error::invalid(format!(
                "tensor `{name}`: the slices of ranks {} ({:?}) and {} ({:?}) overlap",
                other.rank, other.region, slice.rank, slice.region
            )));
        }
        active.push(slice);
    }
    let total = Region::whole(&logical.shape).elements();
    let covered = slices
        .iter()
        .fold(0u64, |sum, s| sum.saturating_add(s.region.elements()));
    if covered != total {
        return Err(Error::invalid(format!(
            "tensor `{name}`: its slices hold {covered} of its {total} elements"
        )));
    }
    Ok(())
}
