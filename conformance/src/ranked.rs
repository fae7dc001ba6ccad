//! A model that a job of any number of ranks writes as tensor slices, with the bytes every
//! rank and every other layout must find: what the multi-rank case, the multi-process tests
//! and the benchmarks share.

use crate::strategies::noise;
use weightbay::{Bytes, DType, Tensor, Writer};
use weightbay_checkpoints::{RankSave, Region};

/// How one tensor of a [`SlicedModel`] is split among ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Along this dimension, in nearly equal parts ([`Region::split`]).
    Along(usize),
    /// Whole, by the last rank.
    Whole,
}

/// One tensor of a [`SlicedModel`].
#[derive(Debug, Clone)]
pub struct ModelTensor {
    /// Its name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its whole shape.
    pub shape: Vec<u64>,
    /// How ranks split it.
    pub split: Split,
    /// All its bytes, row-major.
    pub bytes: Vec<u8>,
}

/// Tensors with bytes that depend on the step, split among ranks as each says.
#[derive(Debug, Clone)]
pub struct SlicedModel {
    /// The tensors.
    pub tensors: Vec<ModelTensor>,
}

impl SlicedModel {
    /// The conformance model of `step`: row, column and middle-dimension splits (some of them
    /// leaving a rank an empty slice), a whole vector and a scalar. `rows` scales the first
    /// dimension of the row-split tensor.
    pub fn small(step: u64, rows: u64) -> Self {
        Self::new(
            step,
            &[
                ("layer.w", DType::F32, &[rows, 7], Split::Along(0)),
                ("embed", DType::BF16, &[6, 10], Split::Along(1)),
                ("conv", DType::I16, &[4, 3, 5], Split::Along(1)),
                ("bias", DType::F32, &[7], Split::Whole),
                ("count", DType::U8, &[], Split::Whole),
            ],
        )
    }

    /// A model of the given `(name, dtype, shape, split)` tensors, bytes derived from `step`.
    pub fn new(step: u64, tensors: &[(&str, DType, &[u64], Split)]) -> Self {
        Self {
            tensors: tensors
                .iter()
                .enumerate()
                .map(|(i, &(name, ref dtype, shape, split))| {
                    let len = dtype.element_size().unwrap_or(1) * shape.iter().product::<u64>();
                    ModelTensor {
                        name: name.to_owned(),
                        dtype: dtype.clone(),
                        shape: shape.to_vec(),
                        split,
                        bytes: noise(step.wrapping_mul(131).wrapping_add(i as u64), len as usize),
                    }
                })
                .collect(),
        }
    }

    /// Every tensor whole, for a single-process save of the same checkpoint.
    pub fn whole(&self) -> Vec<Tensor> {
        self.tensors
            .iter()
            .map(|t| {
                Tensor::new(
                    &t.name,
                    t.dtype.clone(),
                    t.shape.clone(),
                    Bytes::from(t.bytes.clone()),
                )
            })
            .collect()
    }

    /// The region of tensor `t` that `rank` of `world_size` holds, if it holds one.
    pub fn region_of(&self, t: &ModelTensor, rank: u32, world_size: u32) -> Option<Region> {
        match t.split {
            Split::Along(dim) => Some(Region::split(
                &t.shape,
                dim,
                u64::from(world_size),
                u64::from(rank),
            )),
            Split::Whole => (rank + 1 == world_size).then(|| Region::whole(&t.shape)),
        }
    }

    /// What `rank` of `world_size` saves: its slice of every split tensor, and the whole ones
    /// if it is the last rank; `writer` sets the format and other options.
    pub fn rank_save(
        &self,
        rank: u32,
        world_size: u32,
        writer: impl FnOnce(Vec<Tensor>) -> Writer,
    ) -> RankSave {
        let mut tensors = Vec::new();
        let mut slices = Vec::new();
        for t in &self.tensors {
            let Some(region) = self.region_of(t, rank, world_size) else {
                continue;
            };
            tensors.push(Tensor::new(
                &t.name,
                t.dtype.clone(),
                region.lengths.clone(),
                Bytes::from(self.region_bytes(t, &region)),
            ));
            if t.split != Split::Whole {
                slices.push((t.name.clone(), t.shape.clone(), region));
            }
        }
        slices.into_iter().fold(
            RankSave::new(rank, world_size, writer(tensors)),
            |save, (name, shape, region)| save.with_slice(name, shape, region),
        )
    }

    /// The bytes of `region` of tensor `t`, row-major: the reference a load is compared with.
    pub fn region_bytes(&self, t: &ModelTensor, region: &Region) -> Vec<u8> {
        let size = t.dtype.element_size().unwrap_or(1) as usize;
        let dims = t.shape.len();
        if region.elements() == 0 {
            return Vec::new();
        }
        if dims == 0 {
            return t.bytes.clone();
        }
        let row = region.lengths[dims - 1] as usize * size;
        let mut out = Vec::with_capacity(region.elements() as usize * size);
        let mut index = vec![0u64; dims - 1];
        loop {
            let element = (0..dims).fold(0u64, |acc, dim| {
                let at = region.offsets[dim] + index.get(dim).copied().unwrap_or(0);
                acc * t.shape[dim] + at
            });
            let start = element as usize * size;
            out.extend_from_slice(&t.bytes[start..start + row]);
            let mut dim = dims - 1;
            loop {
                if dim == 0 {
                    return out;
                }
                dim -= 1;
                index[dim] += 1;
                if index[dim] < region.lengths[dim] {
                    break;
                }
                index[dim] = 0;
            }
        }
    }
}
