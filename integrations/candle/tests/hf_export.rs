//! A checkpoint written by four ranks, exported to the Hugging Face layout, loads in
//! candle-transformers' own Llama through `VarBuilder::from_mmaped_safetensors`, its logits
//! bit for bit those of the same model loaded from one unsharded file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor as CandleTensor};
use candle_nn::VarBuilder;
use candle_transformers::models::llama::{Cache, Config, Llama};
use weightbay::{Format, Storage, Tensor, Writer};
use weightbay_checkpoints::{Checkpoints, ExportOptions, RankSave, Region};
use weightbay_local::LocalStorage;

const WORLD: u64 = 4;

/// A tiny Llama with grouped-query attention (4 heads sharing 2 key-value heads) and tied
/// embeddings.
fn config() -> Config {
    Config {
        hidden_size: 64,
        intermediate_size: 128,
        vocab_size: 96,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        use_flash_attn: false,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        bos_token_id: None,
        eos_token_id: None,
        rope_scaling: None,
        max_position_embeddings: 32,
        tie_word_embeddings: true,
    }
}

/// The model's tensors, as transformers names them, with seeded values; `lm_head.weight`
/// holds the embedding's bytes, as a tied model's state dict does.
fn model() -> Vec<(String, Vec<u64>, Vec<f32>)> {
    let (h, i, v, kv) = (64u64, 128u64, 96u64, 32u64);
    let mut shapes = vec![
        ("model.embed_tokens.weight".to_owned(), vec![v, h]),
        ("model.norm.weight".to_owned(), vec![h]),
    ];
    for layer in 0..2 {
        let at = |name: &str| format!("model.layers.{layer}.{name}");
        shapes.extend([
            (at("self_attn.q_proj.weight"), vec![h, h]),
            (at("self_attn.k_proj.weight"), vec![kv, h]),
            (at("self_attn.v_proj.weight"), vec![kv, h]),
            (at("self_attn.o_proj.weight"), vec![h, h]),
            (at("mlp.gate_proj.weight"), vec![i, h]),
            (at("mlp.up_proj.weight"), vec![i, h]),
            (at("mlp.down_proj.weight"), vec![h, i]),
            (at("input_layernorm.weight"), vec![h]),
            (at("post_attention_layernorm.weight"), vec![h]),
        ]);
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut tensors: Vec<(String, Vec<u64>, Vec<f32>)> = shapes
        .into_iter()
        .map(|(name, shape)| {
            let count = shape.iter().product::<u64>();
            let values = (0..count)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed % 2001) as f32 / 1000.0 - 1.0
                })
                .collect();
            (name, shape, values)
        })
        .collect();
    let embedding = tensors[0].clone();
    tensors.push(("lm_head.weight".to_owned(), embedding.1, embedding.2));
    tensors
}

/// The box of a row-major matrix `values` of `width` columns that `region` names.
fn cut(values: &[f32], width: u64, region: &Region) -> Vec<f32> {
    let mut out = Vec::new();
    for row in region.offsets[0]..region.offsets[0] + region.lengths[0] {
        let start = (row * width + region.offsets[1]) as usize;
        out.extend_from_slice(&values[start..start + region.lengths[1] as usize]);
    }
    out
}

/// Step 1 from four ranks: projections into the model split by rows, out of it (o_proj,
/// down_proj) by columns, norms whole on rank 0.
fn save_by_four_ranks(checkpoints: &Checkpoints) {
    for rank in 0..WORLD {
        let mut tensors = Vec::new();
        let mut slices = Vec::new();
        for (name, shape, values) in model() {
            if shape.len() == 1 {
                if rank == 0 {
                    tensors.push(Tensor::from_slice(name, shape, &values));
                }
                continue;
            }
            let dim = usize::from(name.ends_with("o_proj.weight") || name.contains("down_proj"));
            let region = Region::split(&shape, dim, WORLD, rank);
            let part = cut(&values, shape[1], &region);
            tensors.push(Tensor::from_slice(
                name.as_str(),
                region.lengths.clone(),
                &part,
            ));
            slices.push((name, shape, region));
        }
        let mut save = RankSave::new(rank as u32, WORLD as u32, Writer::new(tensors));
        for (name, shape, region) in slices {
            save = save.with_slice(name, shape, region);
        }
        checkpoints.save_rank(1, save).unwrap();
    }
}

fn logits(files: &[PathBuf]) -> Vec<f32> {
    let device = Device::Cpu;
    // SAFETY: the files are this test's own, and nothing changes them while they are mapped.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(files, DType::F32, &device) }.unwrap();
    let config = config();
    let llama = Llama::load(vb, &config).unwrap();
    let mut cache = Cache::new(false, DType::F32, &config, &device).unwrap();
    let prompt = CandleTensor::new(&[[1u32, 5, 9, 2, 7, 3]], &device).unwrap();
    let out = llama.forward(&prompt, 0, &mut cache).unwrap();
    out.flatten_all().unwrap().to_vec1().unwrap()
}

fn in_dir(dir: &Path, names: impl IntoIterator<Item = String>) -> Vec<PathBuf> {
    names.into_iter().map(|name| dir.join(name)).collect()
}

#[test]
fn a_four_rank_export_loads_in_candle_transformers_llama_with_the_same_logits() {
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(LocalStorage::new(dir.path()));
    // The reference: every tensor in one file, as one process would save it.
    let whole = model()
        .into_iter()
        .map(|(name, shape, values)| Tensor::from_slice(name, shape, &values))
        .collect();
    Writer::new(whole)
        .with_format(Format::Safetensors)
        .write_to(storage.as_ref(), "reference.safetensors")
        .unwrap();
    let expected = logits(&in_dir(dir.path(), ["reference.safetensors".to_owned()]));

    let checkpoints = Checkpoints::over(Arc::clone(&storage), "run");
    save_by_four_ranks(&checkpoints);
    let options = ExportOptions::default()
        .with_max_shard_size(40_000)
        .tying_lm_head();
    let summary = checkpoints
        .open(1)
        .unwrap()
        .export(Arc::clone(&storage), "hf", &options)
        .unwrap();
    assert_eq!(summary.tied.len(), 1, "{summary:?}");
    assert!(summary.shards.len() > 2, "{summary:?}");
    let exported = logits(&in_dir(dir.path(), summary.shards));
    assert_eq!(exported.len(), 96);
    assert!(
        exported
            .iter()
            .zip(&expected)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "the exported model's logits differ from the unsharded model's"
    );
}
