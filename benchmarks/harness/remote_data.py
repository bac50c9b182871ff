"""The data of ``benchmarks/remote.py``: the read benchmark's photo-like JPEG tree
(:func:`harness.throughput.prepare_images`) and the same samples (JPEG bytes + label) written
by packer (NPY and LMDB), LitData (``litdata.optimize``) and MosaicML Streaming (``MDSWriter``),
each with shards (chunks) of ``shard_mb`` MB, made once per setting and reused.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import packer
from harness.throughput import prepare_images
from packer.core.manifest import MANIFEST_NAME, load_manifest
from packer.source.images import scan

__all__ = ["OUTPUTS", "prepare", "tree_bytes"]

OUTPUTS = ("packer.npy", "packer.lmdb", "litdata", "mds")


def tree_bytes(folder: Path) -> int:
    """The bytes of every file under ``folder``."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _litdata_item(item: tuple[str, int]) -> dict[str, Any]:
    path, label = item
    return {"image": Path(path).read_bytes(), "label": label}


def _write_litdata(samples: list[tuple[str, int]], dst: Path, shard_mb: int) -> None:
    import litdata

    litdata.optimize(
        fn=_litdata_item,
        inputs=samples,
        output_dir=str(dst),
        chunk_bytes=f"{shard_mb}MB",
        num_workers=1,
        reorder_files=False,
        mode="overwrite",
        verbose=False,
    )


def _write_mds(samples: list[tuple[str, int]], dst: Path, shard_mb: int) -> None:
    from streaming import MDSWriter

    columns = {"image": "bytes", "label": "int"}
    with MDSWriter(out=str(dst), columns=columns, size_limit=shard_mb << 20) as out:
        for path, label in samples:
            out.write({"image": Path(path).read_bytes(), "label": label})


def _write_packer(src: Path, dst: Path, shard_mb: int) -> None:
    packer.convert(src, dst, shard_size=shard_mb << 20, overwrite=True, progress=False)


def prepare(
    root: Path, images: int, shard_mb: int, log: Callable[[str], None]
) -> tuple[Path, dict[str, Path]]:
    """The JPEG tree and each output of it by name (:data:`OUTPUTS`), made when missing."""
    src, _ = prepare_images(root, images, log, formats={})
    samples = [(s.path, int(s.label)) for s in scan(src).samples]
    work = root / f"n{images}" / f"remote-{shard_mb}MB"
    outputs = {name: work / name for name in OUTPUTS}
    marker = work / "made.json"
    expected = {"images": images, "shard_mb": shard_mb, "outputs": list(OUTPUTS)}
    if marker.is_file() and json.loads(marker.read_text()) == expected:
        if load_manifest(outputs["packer.npy"]).num_samples == images:
            log(f"reusing {work}")
            return src, outputs
    work.mkdir(parents=True, exist_ok=True)
    for name, dst in outputs.items():
        log(f"writing {dst} ...")
        if dst.exists():
            shutil.rmtree(dst)
        if name.startswith("packer."):
            _write_packer(src, dst, shard_mb)
        elif name == "litdata":
            _write_litdata(samples, dst, shard_mb)
        else:
            _write_mds(samples, dst, shard_mb)
    assert (outputs["packer.npy"] / MANIFEST_NAME).is_file()
    marker.write_text(json.dumps(expected))
    return src, outputs
