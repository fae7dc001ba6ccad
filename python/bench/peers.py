"""weightbay beside the systems a PyTorch user would pick instead, on the same bytes and the same
S3 server, each run in a process of its own.

Rows (each system's every run shown, then its median and median / weightbay's; above 1 means
weightbay is faster):

- ``s3-load``: a safetensors file of ``--size-mib`` (a 1024-wide transformer's bf16 weights)
  from the S3 server into CPU tensors: ``weightbay.load`` (with its defaults, and with the 16 MiB
  ranged requests it makes to a store on another machine) against Run:ai Model Streamer
  (``SafetensorsStreamer``), s3torchconnector (``S3Client.get_object`` + ``safetensors.torch.load``)
  and fsspec (``s3fs`` + ``safetensors.torch.load``). The server's own limit is paired in the
  same rounds: one whole-object GET by ``curl`` into ``/dev/null``, and the object in 16 MiB
  ranged GETs, 16 at once, by one ``curl --parallel``.
- ``local-load``: the same file from local disk, the page cache dropped before every run:
  ``weightbay.load`` against Run:ai, fastsafetensors (its CPU path, ``nogds=True``) and
  ``safetensors.torch.load_file``, with the disk's limit (``cat`` into ``/dev/null``) beside them.
- ``dcp`` (a save table and a load table): a DCP state dict of ``--size-mib`` (bf16 weights, two
  fp32 Adam moments each) saved by one process to the S3 server with
  ``weightbay.torch.StorageWriter`` (twice: with its defaults, and with the 16 MiB requests
  it makes to a store on another machine), s3torchconnector's ``S3StorageWriter`` and DCP's
  ``FsspecWriter`` over ``s3fs``, each with the defaults a user gets; then loaded back by the
  system that saved it into a state dict of the same shapes.
- ``dcp-reshard``: the same state dict, saved by one process (untimed), loaded by two ranks
  (gloo on 127.0.0.1, each a process of its own) into DTensors sharded along their first
  dimension: each rank reads half of every tensor. The time is the slower rank's, from a
  barrier before the load to one after it; CPU and what the phase added are both ranks' sum.
- ``proxy-load``, ``faults-load``, ``proxy-save``, ``faults-save``: the S3 load and the DCP save
  (loaded back from the server itself, and checked) through a proxy of the fault proxy
  (``scripts/servers.sh start proxy``, found by ``WEIGHTBAY_FAULT_PROXY``) in front of the same
  server: a clean one (what the proxy itself costs), and one that answers 10% of requests
  ``503 SlowDown`` and holds 3% of responses after the server has served them. weightbay (its
  remote-store requests) against s3torchconnector, whose AWS Common Runtime client has stall
  handling of its own.

Every run lands or touches every byte (a memory-mapped load has every page of every tensor
read), and what each run loaded is checked against the others by a CRC-32 of every tensor,
taken after the clock stops. Beside each time: the client's CPU seconds per GiB in the timed
phase, the process's peak RSS in the phase (which holds the tensors themselves: the state or
the result, and torch) and how much of it the phase added (a load: the result and its buffers;
a save: what it holds beside the state).
The order of the systems rotates every round.

The S3 server is the one the environment names (``AWS_ENDPOINT``, ``AWS_BUCKET`` and the keys),
meant to be the disk-backed one that ``scripts/servers.sh start s3-disk`` starts::

    vars=$(scripts/servers.sh start s3-disk) && eval "$vars"
    python python/bench/peers.py --size-mib 2048 --runs 3

The peers install into the test venv with ``pip install -r python/bench/requirements-peers.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
import zlib
from pathlib import Path
from typing import Any

from layouts import LAYER_SHAPES, elements

PAGE = 4096
REGION = "us-east-1"
MODEL_KEY = "peers/model.safetensors"

CHECKSUMS_WHEN_REQUIRED = {
    "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
}
"""botocore (under boto3 and s3fs) stores a CRC32 with every upload and checks it on every
GET by default; s3s-fs answers a GET of a multipart object with a checksum botocore rejects
("Expected checksum ... did not match"), so the AWS tools' own switch turns both off, for
every process of the bench alike (the other clients send none)."""

RANGED = "weightbay, 16 MiB requests"
"""weightbay as it loads from a store on another machine: parallel ranged GETs of 16 MiB. For an
endpoint on this machine its default is one GET per run of adjacent tensors (emulators such as
moto read a whole object for every ranged GET of it); this row sets what a remote store gets."""

PARALLEL_LIMIT = "limit: curl, 16 ranged GETs at once"
"""The server's limit for parallel readers: the object in 16 MiB ranges, 16 at a time, by one
curl."""

ROWS: dict[str, list[str]] = {
    "s3-load": [
        RANGED,
        "weightbay",
        "runai",
        "s3torchconnector",
        "fsspec",
        "limit: curl GET",
        PARALLEL_LIMIT,
    ],
    "local-load": ["weightbay", "runai", "fastsafetensors", "safetensors", "limit: cat"],
    "dcp": [RANGED, "weightbay", "s3torchconnector", "fsspec"],
    "dcp-reshard": [RANGED, "s3torchconnector", "fsspec"],
    "proxy-load": [RANGED, "s3torchconnector"],
    "faults-load": [RANGED, "s3torchconnector"],
    "proxy-save": [RANGED, "s3torchconnector"],
    "faults-save": [RANGED, "s3torchconnector"],
}
"""Each row's systems; the first is what the others are divided by."""

RESHARD_WORLD = 2
"""The ranks the resharded load runs on; the checkpoint was saved by one."""

FAULTS = {"status_share": 0.10, "status": 503, "hold_share": 0.03, "max_stall_s": 60, "seed": 7}
"""10% of requests answered 503 SlowDown, 3% served and then held (nothing sent until the client
hangs up, or for at most 60 s, so a client that never gives up still ends)."""

PROXIED: dict[str, tuple[str, dict[str, Any]]] = {
    "proxy-load": ("s3-load", {}),
    "faults-load": ("s3-load", FAULTS),
    "proxy-save": ("dcp", {}),
    "faults-save": ("dcp", FAULTS),
}
"""Rows run through a proxy of the fault proxy (``scripts/servers.sh start proxy``) in front of
the server: what they do, and the faults their proxy injects (none: the proxy's own cost)."""


def transformer(size_mib: int) -> dict[str, Any]:
    """bf16 layers of a 1024-wide transformer until `size_mib`, each tensor its own values,
    which vary along it (so a load of the wrong part of a tensor changes the digest)."""
    import torch

    tensors, total, layer = {}, 0, 0
    while total < size_mib << 20:
        for index, (name, shape) in enumerate(LAYER_SHAPES.items()):
            first = float(layer * len(LAYER_SHAPES) + index)
            values = torch.arange(elements(shape), dtype=torch.float32).remainder_(1021)
            tensors[f"layers.{layer}.{name}"] = values.add_(first).reshape(shape).bfloat16()
            total += 2 * elements(shape)
        layer += 1
    return tensors


def state(size_mib: int) -> dict[str, Any]:
    """A DCP state dict of about `size_mib`: the transformer's bf16 weights and two fp32 Adam
    moments per weight."""
    import torch

    weights = transformer(size_mib * 2 // 10)
    optim = {}
    for key, weight in weights.items():
        optim[f"{key}.exp_avg"] = weight.to(torch.float32).mul_(0.5)
        optim[f"{key}.exp_avg_sq"] = weight.to(torch.float32)
    return {"model": weights, "optim": optim}


def flattened(tensors: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tensors.items():
        if isinstance(value, dict):
            out.update(flattened(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def sharded_targets(size_mib: int) -> dict[str, Any]:
    """What a rank of the resharded load loads into: the state dict's tensors as empty DTensors
    over all ranks (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), sharded along
    their first dimension. The full state is never made: its shapes come from a meta-device
    copy."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor import empty as empty_dtensor

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    with torch.device("meta"):
        shapes = state(size_mib)
    return {
        group: {
            name: empty_dtensor(
                tuple(value.shape), dtype=value.dtype, device_mesh=mesh, placements=[Shard(0)]
            )
            for name, value in tensors.items()
        }
        for group, tensors in shapes.items()
    }


def local(value: Any) -> Any:
    """A DTensor's shard on this rank; any other tensor as it is."""
    from torch.distributed.tensor import DTensor

    return value.to_local() if isinstance(value, DTensor) else value


def touched(tensors: dict[str, Any]) -> None:
    """Reads one byte of every page of every tensor (a mapped tensor's pages fault in)."""
    import torch

    for tensor in tensors.values():
        int(tensor.reshape(-1).view(torch.uint8)[::PAGE].sum())


def digest(tensors: dict[str, Any]) -> str:
    """CRC-32 of every tensor's bytes, in name order: equal digests, equal loads."""
    import torch

    crc, total = 0, 0
    for name in sorted(tensors):
        data = tensors[name].contiguous().reshape(-1).view(torch.uint8).numpy()
        crc = zlib.crc32(name.encode(), crc)
        crc = zlib.crc32(memoryview(data), crc)
        total += data.nbytes
    return f"{crc:08x}/{total}"


def endpoint() -> str:
    return os.environ["AWS_ENDPOINT"]


def bucket() -> str:
    return os.environ["AWS_BUCKET"]


def s3fs_options() -> dict[str, Any]:
    return {
        "endpoint_url": endpoint(),
        "key": os.environ["AWS_ACCESS_KEY_ID"],
        "secret": os.environ["AWS_SECRET_ACCESS_KEY"],
    }


def s3torch_client() -> Any:
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client

    return S3Client(
        REGION, endpoint=endpoint(), s3client_config=S3ClientConfig(force_path_style=True)
    )


def s3torch_filesystem(reader_constructor: Any = None) -> Any:
    """s3torchconnector's DCP filesystem pointed at the server: its writer and reader take no
    endpoint, so the bench swaps in a filesystem over a client that has one (a reader's with
    the reader's own constructor, into which its planner injects the ranges it will read)."""
    from s3torchconnector.dcp.s3_file_system import S3FileSystem

    return S3FileSystem(REGION, s3_client=s3torch_client(), reader_constructor=reader_constructor)


def load_from_s3(system: str) -> dict[str, Any]:
    import safetensors.torch

    url = f"s3://{bucket()}/{MODEL_KEY}"
    if system in ("weightbay", RANGED):
        import weightbay

        return weightbay.load(url)
    if system == "runai":
        from runai_model_streamer import SafetensorsStreamer

        with SafetensorsStreamer() as streamer:
            streamer.stream_file(url)
            return dict(streamer.get_tensors())
    if system == "s3torchconnector":
        body = s3torch_client().get_object(bucket(), MODEL_KEY).read()
        return safetensors.torch.load(body)
    if system == "fsspec":
        import s3fs

        with s3fs.S3FileSystem(**s3fs_options()).open(f"{bucket()}/{MODEL_KEY}", "rb") as file:
            return safetensors.torch.load(file.read())
    raise ValueError(system)


def load_from_disk(system: str, path: Path) -> dict[str, Any]:
    if system == "weightbay":
        import weightbay

        return weightbay.load(path)
    if system == "runai":
        from runai_model_streamer import SafetensorsStreamer

        with SafetensorsStreamer() as streamer:
            streamer.stream_file(str(path))
            return dict(streamer.get_tensors())
    if system == "fastsafetensors":
        from fastsafetensors import SafeTensorsFileLoader

        loader = SafeTensorsFileLoader(None, "cpu", nogds=True)
        loader.add_filenames({0: [str(path)]})
        buffers = loader.copy_files_to_device()
        tensors = {name: buffers.get_tensor(name) for name in loader.get_keys()}
        return tensors
    if system == "safetensors":
        import safetensors.torch

        return safetensors.torch.load_file(path)
    raise ValueError(system)


def dcp_prefix(system: str) -> str:
    """Where `system`'s DCP checkpoints go, under the bucket."""
    return "peers/dcp/" + system.replace(", ", "-").replace(" ", "-")


def dcp_location(system: str, round: int) -> str:
    return f"s3://{bucket()}/{dcp_prefix(system)}/round-{round}"


def dcp_save(system: str, sd: dict[str, Any], location: str) -> None:
    import torch.distributed.checkpoint as dcp

    if system in ("weightbay", RANGED):
        import weightbay.torch

        dcp.save(sd, storage_writer=weightbay.torch.StorageWriter(location, 1))
    elif system == "s3torchconnector":
        from s3torchconnector.dcp import S3StorageWriter

        writer = S3StorageWriter(REGION, location)
        writer.fs = s3torch_filesystem()
        writer.path = writer.fs.init_path(location)
        dcp.save(sd, storage_writer=writer)
    elif system == "fsspec":
        from torch.distributed.checkpoint import FsspecWriter

        dcp.save(sd, storage_writer=FsspecWriter(location, **s3fs_options()))
    else:
        raise ValueError(system)


def dcp_load(system: str, sd: dict[str, Any], location: str) -> None:
    import torch.distributed.checkpoint as dcp

    if system in ("weightbay", RANGED):
        import weightbay.torch

        dcp.load(sd, storage_reader=weightbay.torch.StorageReader(location, 1))
    elif system == "s3torchconnector":
        from s3torchconnector.dcp import S3StorageReader

        reader = S3StorageReader(REGION, location)
        reader.fs = s3torch_filesystem(reader._reader_constructor)
        reader.path = reader.fs.init_path(location)
        dcp.load(sd, storage_reader=reader)
    elif system == "fsspec":
        from torch.distributed.checkpoint import FsspecReader

        dcp.load(sd, storage_reader=FsspecReader(location, **s3fs_options()))
    else:
        raise ValueError(system)


def child(row: str, system: str, argument: str, size_mib: int) -> dict[str, Any]:
    """Runs one timed operation in this process: its seconds, CPU seconds and digest."""
    import torch

    warnings.filterwarnings("ignore")
    prepared: dict[str, Any] = {}
    if row == "dcp-reshard":
        prepared = sharded_targets(size_mib)
    elif row.startswith("dcp-"):
        prepared = state(size_mib)
        if row == "dcp-load":
            prepared = {
                g: {k: torch.empty_like(v) for k, v in d.items()} for g, d in prepared.items()
            }

    def run() -> dict[str, Any]:
        if row == "s3-load":
            return load_from_s3(system)
        if row == "local-load":
            return load_from_disk(system, Path(argument))
        if row == "dcp-save":
            dcp_save(system, prepared, argument)
        else:
            dcp_load(system, prepared, argument)
        return {name: local(value) for name, value in flattened(prepared).items()}

    # The phase's own peak: the high-water mark reset to the current RSS just before it starts.
    Path("/proc/self/clear_refs").write_text("5\n")
    rss_before = status_kib("VmRSS")
    ranks = row == "dcp-reshard"
    if ranks:
        import torch.distributed as dist

        dist.barrier()
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    tensors = run()
    touched(tensors)
    if ranks:
        dist.barrier()
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    used = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
    peak = status_kib("VmHWM")
    return {
        "seconds": seconds,
        "cpu": used,
        "peak_mib": peak / 1024,
        "added_mib": (peak - rss_before) / 1024,
        "digest": digest(tensors),
    }


def status_kib(field: str) -> int:
    """A memory figure of this process from /proc/self/status, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def limit(row: str, system: str, path: Path) -> dict[str, Any]:
    """The server's or the disk's limit for the row's bytes, timed from outside."""
    if row == "s3-load":
        signed = [
            "-sS", "--fail", "-o", "/dev/null", "--aws-sigv4", f"aws:amz:{REGION}:s3",
            "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",
            "--user", f"{os.environ['AWS_ACCESS_KEY_ID']}:{os.environ['AWS_SECRET_ACCESS_KEY']}",
        ]  # fmt: skip
        url = f"{endpoint()}/{bucket()}/{MODEL_KEY}"
        if system == PARALLEL_LIMIT:
            size, step = path.stat().st_size, 16 << 20
            command = ["curl", "--silent", "--parallel", "--parallel-max", "16"]
            for offset in range(0, size, step):
                end = min(offset + step, size) - 1
                command += [*signed, "-r", f"{offset}-{end}", url, "--next"]
            command.pop()
        else:
            command = ["curl", *signed, url]
    else:
        command = ["cat", str(path)]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return {"seconds": time.perf_counter() - start, "cpu": None, "digest": None}


def child_env(system: str, via: str | None) -> dict[str, str]:
    """The environment of a child process of `system`, talking to the endpoint `via` if given,
    else to the server."""
    # Run:ai's client reads the endpoint from AWS_ENDPOINT_URL and addresses buckets by host
    # name unless told otherwise; the AWS tools' variable, set for every system alike.
    target = via or endpoint()
    env = dict(
        os.environ,
        AWS_ENDPOINT=target,
        AWS_ENDPOINT_URL=target,
        AWS_EC2_METADATA_DISABLED="true",
    )
    env["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"] = "0"
    env.update(CHECKSUMS_WHEN_REQUIRED)
    if system == RANGED:
        env["WEIGHTBAY_FETCH_REQUEST_LEN"] = str(16 << 20)
    return env


def timed(
    row: str, system: str, argument: str, size_mib: int, via: str | None = None
) -> dict[str, Any]:
    """Runs `child` in a process of its own, talking to the endpoint `via` if given."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", row, system, argument, str(size_mib)],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(system, via),
    )
    if out.returncode != 0:
        return {"error": f"exit {out.returncode}"}
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def timed_ranks(system: str, location: str, size_mib: int) -> dict[str, Any]:
    """Runs the resharded load of `location` on `RESHARD_WORLD` ranks, each a process of its
    own: the slower rank's seconds, both ranks' CPU seconds and added RSS, the larger peak, and
    their digests in rank order."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, __file__, "--child", "dcp-reshard", system, location, str(size_mib)]
    ranks = [
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            text=True,
            env=dict(
                child_env(system, None),
                RANK=str(rank),
                WORLD_SIZE=str(RESHARD_WORLD),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            ),
        )
        for rank in range(RESHARD_WORLD)
    ]
    outputs = [process.communicate()[0] for process in ranks]
    failed = [f"rank {r}: exit {p.returncode}" for r, p in enumerate(ranks) if p.returncode]
    if failed:
        return {"error": ", ".join(failed)}
    results = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    return {
        "seconds": max(r["seconds"] for r in results),
        "cpu": sum(r["cpu"] for r in results),
        "peak_mib": max(r["peak_mib"] for r in results),
        "added_mib": sum(r["added_mib"] for r in results),
        "digest": "+".join(r["digest"] for r in results),
    }


def settled(drop: bool) -> None:
    os.sync()
    if drop:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    time.sleep(1)


def rotated(systems: list[str], round: int) -> list[str]:
    first = round % len(systems)
    return systems[first:] + systems[:first]


def s3_client() -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint(),
        aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        region_name=REGION,
    )


def removed(prefix: str) -> None:
    """Deletes every object under `prefix` of the bucket (between runs, untimed), one key at a
    time: s3s-fs answers DeleteObjects with a 500, and lists to s3fs' `find` only "folders"."""
    client = s3_client()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket(), Prefix=prefix):
        for item in page.get("Contents", []):
            client.delete_object(Bucket=bucket(), Key=item["Key"])


def uploaded(path: Path) -> None:
    s3_client().upload_file(str(path), bucket(), MODEL_KEY)


def report(
    row: str,
    runs: dict[str, list[dict[str, Any]]],
    also: dict[str, list[dict[str, Any]]] | None = None,
) -> list[str]:
    """Markdown lines of a row's table, each system's median divided by the first's; raises if
    two of its runs (or of `also`'s) hold different bytes."""
    own = [r["seconds"] for r in next(iter(runs.values())) if "seconds" in r]
    ours = statistics.median(own) if own else float("nan")
    everything = [*runs.values(), *(also or {}).values()]
    digests = {r["digest"] for rs in everything for r in rs if r.get("digest")}
    if len(digests) != 1:
        raise SystemExit(f"{row}: systems loaded different bytes (or none): {sorted(digests)}")
    # A digest per rank, joined by "+", each "crc/bytes".
    gib = sum(int(part.split("/")[1]) for part in digests.pop().split("+")) / (1 << 30)
    lines = [
        f"\n{row} ({gib:.2f} GiB)\n",
        "| system | runs (s) | median (s) | median / the first's | CPU s per GiB"
        " | peak RSS (MiB) | of which the phase added (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for system, results in runs.items():
        ok = [r for r in results if "seconds" in r]
        failed = [r["error"] for r in results if "error" in r]
        if not ok:
            lines.append(f"| {system} | failed: {', '.join(failed)} | | | | | |")
            continue
        median = statistics.median(r["seconds"] for r in ok)
        shown = " ".join(f"{r['seconds']:.2f}" for r in ok) + "".join(f" ({e})" for e in failed)
        cpu = [r["cpu"] for r in ok if r["cpu"] is not None]
        peak = [r["peak_mib"] for r in ok if "peak_mib" in r]
        added = [r["added_mib"] for r in ok if "added_mib" in r]
        cpu_text = f"{statistics.median(cpu) / gib:.2f}" if cpu else ""
        peak_text = f"{max(peak):.0f} | {max(added):.0f}" if peak else " | "
        ratio = f"{median / ours:.2f}x"
        lines.append(f"| {system} | {shown} | {median:.2f} | {ratio} | {cpu_text} | {peak_text} |")
    return lines


def control(method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """Asks the fault proxy's control port (``WEIGHTBAY_FAULT_PROXY``)."""
    import urllib.request

    request = urllib.request.Request(
        os.environ["WEIGHTBAY_FAULT_PROXY"] + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
    )
    with urllib.request.urlopen(request) as answer:
        result: dict[str, Any] = json.loads(answer.read())
        return result


def main() -> None:
    os.environ.update(CHECKSUMS_WHEN_REQUIRED)
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, row, system, argument, size_mib = sys.argv
        print(json.dumps(child(row, system, argument, int(size_mib))))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="local directory (a disk)")
    parser.add_argument("--only", choices=sorted(ROWS), action="append", default=None)
    args = parser.parse_args()
    rows = args.only or list(ROWS)
    base = Path(tempfile.mkdtemp(dir=args.dir, prefix="weightbay-peers-"))
    proxies: dict[str, str] = {}
    try:
        import safetensors.torch

        path = base / "model.safetensors"
        model = transformer(args.size_mib)
        safetensors.torch.save_file(model, path)
        del model
        kinds = {row: PROXIED.get(row, (row, {}))[0] for row in rows}
        if "s3-load" in kinds.values():
            uploaded(path)
        for row in rows:
            if row in PROXIED:
                made = control(
                    "POST", "/proxies", {"upstream": endpoint(), "faults": PROXIED[row][1]}
                )
                proxies[row] = f"http://127.0.0.1:{made['port']}"
        results: dict[str, dict[str, list[dict[str, Any]]]] = {
            row: {system: [] for system in ROWS[row]} for row in rows
        }
        loads: dict[str, dict[str, list[dict[str, Any]]]] = {
            row: {system: [] for system in ROWS[row]} for row in rows
        }
        for round in range(args.runs):
            for row in rows:
                via = proxies.get(row)
                for system in rotated(ROWS[row], round):
                    settled(drop=row == "local-load")
                    if system.startswith("limit"):
                        result = limit(row, system, path)
                    elif row == "dcp-reshard":
                        location = dcp_location(system, round)
                        saved = timed("dcp-save", system, location, args.size_mib)
                        result = (
                            timed_ranks(system, location, args.size_mib)
                            if "error" not in saved
                            else saved
                        )
                        removed(dcp_prefix(system))
                    elif kinds[row] == "dcp":
                        location = dcp_location(system, round)
                        result = timed("dcp-save", system, location, args.size_mib, via)
                        if "error" not in result:
                            # Loaded back from the server itself: what the save left there.
                            loaded = timed("dcp-load", system, location, args.size_mib)
                            loads[row][system].append(loaded)
                        removed(dcp_prefix(system))
                    else:
                        result = timed(kinds[row], system, str(path), args.size_mib, via)
                    results[row][system].append(result)
                    print(f"{row} round {round} {system}: {result}", file=sys.stderr)
        print(f"\n{args.size_mib} MiB, {args.runs} rounds; server {endpoint()}")
        for row in rows:
            if row in proxies:
                counts = control("GET", f"/proxies/{proxies[row].rsplit(':', 1)[1]}")
                print(f"\n{row}: through a proxy with {PROXIED[row][1]}; it counted {counts}")
            if kinds[row] == "dcp":
                print("\n".join(report(f"{row}: save", results[row])))
                # A load must give back what its save held: one digest over both tables.
                print("\n".join(report(f"{row}: load", loads[row], also=results[row])))
            else:
                print("\n".join(report(row, results[row])))
    finally:
        for url in proxies.values():
            control("DELETE", f"/proxies/{url.rsplit(':', 1)[1]}")
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
