"""`weightbay export` proven by the loaders people use: a tiny Llama (grouped-query attention,
tied embeddings) saved by four ranks in row and column slices, or through the DCP plugin,
exported to the Hugging Face layout, then loaded by transformers' `from_pretrained` and by
`safetensors.torch.load_file` shard by shard, its logits equal to the unsharded model's bit
for bit; an aligned export passes safetensors' validation with its tensors on the alignment."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
import weightbay
import weightbay.torch
from safetensors import safe_open
from safetensors.torch import load_file

# Every model here is a local directory: transformers must not look for one on the Hub.
os.environ["HF_HUB_OFFLINE"] = "1"
import transformers

WORLD = 4
PROMPT = torch.tensor([[1, 5, 9, 2, 7, 3]])


def llama(directory: Path, *, wide: bool = False) -> Any:
    """A seeded Llama with grouped-query attention and tied embeddings, its config.json
    written to `directory`: tiny, or `wide` (about 90 MB, for an export slow enough to kill)."""
    sizes = (8192, 512, 2048, 4, 8, 4) if wide else (96, 64, 128, 2, 4, 2)
    vocab, hidden, intermediate, layers, heads, kv_heads = sizes
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=True,
        max_position_embeddings=32,
    )
    torch.manual_seed(7)
    model = transformers.LlamaForCausalLM(config)
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    return model


def save_by_four_ranks(model: Any, run: str) -> None:
    """Step 1 from four ranks: attention and MLP inputs split by rows, their outputs by
    columns, the embedding (and the lm_head it is tied to) by rows, norms whole on rank 0."""
    # The rank-save call the DCP plugin makes (the public Checkpoints has no rank saves).
    checkpoints = weightbay._native.Checkpoints(run)
    state = model.state_dict()
    for rank in range(WORLD):
        tensors: dict[str, torch.Tensor] = {}
        slices: dict[str, tuple[list[int], list[int]]] = {}
        for name, tensor in state.items():
            if tensor.dim() == 1:
                if rank == 0:
                    tensors[name] = tensor
                continue
            dim = 1 if name.endswith(("o_proj.weight", "down_proj.weight")) else 0
            length = tensor.shape[dim] // WORLD
            part = tensor.narrow(dim, rank * length, length).contiguous()
            offsets = [0, 0]
            offsets[dim] = rank * length
            tensors[name] = part
            slices[name] = (list(tensor.shape), offsets)
        checkpoints.save_rank(1, rank, WORLD, weightbay._exportable(tensors), slices=slices)


def export(cli: str, source: str, destination: Path, *options: str) -> str:
    done = subprocess.run(
        [cli, "export", source, str(destination), *options],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def logits(model: Any) -> torch.Tensor:
    """The model's logits for the prompt, in inference mode (no dropout)."""
    torch.nn.Module.eval(model)
    with torch.no_grad():
        return model(PROMPT).logits


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Any, str, str]:
    """The tiny Llama saved by four ranks as step 1 of a run: the model, the run's location and
    the path of its config.json."""
    model = llama(tmp_path / "config")
    run = str(tmp_path / "run")
    save_by_four_ranks(model, run)
    return model, run, str(tmp_path / "config" / "config.json")


def test_a_four_rank_export_loads_in_transformers_with_the_same_logits(
    saved: tuple[Any, str, str], tmp_path: Path, cli: str
) -> None:
    model, run, config = saved
    out = tmp_path / "hf"
    said = export(cli, run, out, "--max-shard-size", "40kB", "--with", config)
    assert "tied: lm_head.weight is written once, as model.embed_tokens.weight" in said, said

    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert "lm_head.weight" not in index["weight_map"]
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05}.safetensors"
    expected = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    loaded: dict[str, torch.Tensor] = {}
    for shard in shards:
        loaded.update(load_file(out / shard))
    assert loaded.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in expected.values())

    exported = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert exported.lm_head.weight.data_ptr() == exported.model.embed_tokens.weight.data_ptr()
    assert torch.equal(logits(exported), logits(model))


def test_a_bf16_export_loads_as_transformers_casts_the_saved_model(
    saved: tuple[Any, str, str], tmp_path: Path, cli: str
) -> None:
    model, run, config = saved
    out = tmp_path / "hf"
    export(cli, run, out, "--dtype", "bf16", "--with", config)
    for shard in out.glob("model-*.safetensors"):
        for name, tensor in load_file(shard).items():
            assert torch.equal(tensor, model.state_dict()[name].to(torch.bfloat16)), name
    # The reference: the model as save_pretrained writes it, cast by transformers on loading.
    model.save_pretrained(tmp_path / "reference")
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "reference", dtype=torch.bfloat16
    )
    exported = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    assert torch.equal(logits(exported), logits(reference))


def test_a_dcp_checkpoint_exports_its_model_without_the_optimizer(tmp_path: Path, cli: str) -> None:
    model = llama(tmp_path / "config")
    optimizer = torch.optim.Adam(model.parameters())
    model(PROMPT).logits.sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    run = tmp_path / "run"
    dcp.save(state, storage_writer=weightbay.torch.StorageWriter(run, 3))
    out = tmp_path / "hf"
    config = str(tmp_path / "config" / "config.json")
    export(cli, str(run), out, "--include", "model.*", "--rename", "model.=", "--with", config)
    exported = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert torch.equal(logits(exported), logits(model))


def data_offsets(shard: Path) -> tuple[int, dict[str, tuple[int, int]]]:
    """The data section's start in the file, and each tensor's offsets within it."""
    with open(shard, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    header.pop("__metadata__", None)
    return 8 + length, {name: tuple(entry["data_offsets"]) for name, entry in header.items()}


def test_an_aligned_export_passes_validation_with_its_tensors_on_the_alignment(
    saved: tuple[Any, str, str], tmp_path: Path, cli: str
) -> None:
    model, run, _ = saved
    out = tmp_path / "hf"
    said = export(cli, run, out, "--align", "4096", "--max-shard-size", "100kB")
    shards = sorted(out.glob("model-*.safetensors"))
    state = model.state_dict()
    aligned = 0
    for shard in shards:
        with safe_open(shard, framework="pt") as opened:
            for name in opened.keys():
                assert torch.equal(opened.get_tensor(name), state[name]), name
        start, offsets = data_offsets(shard)
        assert start % 4096 == 0, shard
        for name, (begin, end) in offsets.items():
            if (end - begin) % 4096 == 0:
                assert (start + begin) % 4096 == 0, f"{shard.name}: {name} at {begin}"
                aligned += 1
    assert aligned > 0
    assert f"of {len(state)} tensors start on a multiple of 4096 bytes" in said, said


def test_an_export_to_any_store_verifies_and_loads_shard_by_shard(
    saved: tuple[Any, str, str], root: str, cli: str
) -> None:
    model, run, _ = saved
    destination = f"{root}/hf"
    done = subprocess.run(
        [cli, "export", run, destination, "--max-shard-size", "40kB"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    index = f"{destination}/model.safetensors.index.json"
    verified = subprocess.run(
        [cli, "verify", index, "--require-checksums"], capture_output=True, text=True, check=False
    )
    assert verified.returncode == 0, verified.stderr
    shards = int(re.search(r"in (\d+) shards", done.stderr).group(1))  # type: ignore[union-attr]
    assert verified.stdout.count("every checksum matches") == shards > 2, verified.stdout
    loaded: dict[str, torch.Tensor] = {}
    for number in range(1, shards + 1):
        loaded.update(weightbay.load(f"{destination}/model-{number:05}-of-{shards:05}.safetensors"))
    assert loaded.keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded[name], tensor), name


def test_an_export_killed_at_random_moments_never_loads_and_a_rerun_does(
    tmp_path: Path, cli: str
) -> None:
    # Big enough that a kill lands while the export writes.
    model = llama(tmp_path / "config", wide=True)
    run = str(tmp_path / "run")
    save_by_four_ranks(model, run)
    random = torch.Generator().manual_seed(5)
    killed_part_way = 0
    for attempt in range(6):
        out = tmp_path / f"hf-{attempt}"
        args = [cli, "export", run, str(out), "--max-shard-size", "20MB"]
        args += ["--with", str(tmp_path / "config" / "config.json")]
        child = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.02 + 0.5 * float(torch.rand(1, generator=random)))
        child.kill()
        finished = child.wait() == 0
        # An index is written last: where there is one (the kill came after it), the model
        # below loads whole; where there is none, transformers finds no model.
        if not (out / "model.safetensors.index.json").exists():
            assert not finished
            killed_part_way += 1
            # No index: transformers finds no model (OSError without weights, ValueError
            # while even config.json, copied just before the index, is missing).
            with pytest.raises((OSError, ValueError)):
                transformers.AutoModelForCausalLM.from_pretrained(out)
            subprocess.run(args, check=True, capture_output=True)
            left = [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
            assert left == [], f"the rerun left a killed export's scratch files: {left}"
        exported = transformers.AutoModelForCausalLM.from_pretrained(out)
        assert torch.equal(logits(exported), logits(model))
    assert killed_part_way > 0, "no kill landed while an export wrote"
