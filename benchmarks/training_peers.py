#!/usr/bin/env python
"""The training path against the peers (issue 31, item 5): decode + RandomResizedCrop(224) + flip,
uint8 batches out of ``DataLoader(num_workers=--workers, batch_size=64)``, in one run.

Data: the image–caption set of ``fields_read.py`` (``--samples`` photo-like 400×350 JPEGs with
captions, made once under ``--root``): packer's LMDB and NPY of the key-grouped files, the same
samples as WebDataset tars, as LitData chunks and as MosaicML Streaming MDS shards. Every reader
returns ``(uint8 3×224×224 image, caption)`` and the default collate stacks the images, written
as each tool's users write it:

- packer: ``open_dataset(..., fields=("jpg", "txt"), transform={"jpg": RandomResizedCrop(224,
  hflip=0.5)})``: the crop fused with the decode, the flip with the crop's copy, in the workers
  like every peer's flip (on a GPU box the batch flip of ``packer.transforms`` runs on the GPU; on
  this CPU-only machine it would take the workers' cores);
- WebDataset: ``.shuffle(1000).decode("pil").to_tuple("jpg", "txt").map_tuple(crop_flip, ...)``;
- LitData / Streaming: a ``StreamingDataset`` subclass whose ``__getitem__`` opens the JPEG with
  Pillow and applies ``crop_flip``;
- HF datasets: ``save_to_disk`` of an ``Image()`` + ``Value("string")`` dataset, read back with
  ``load_from_disk(...).with_transform(...)`` applying ``crop_flip`` to the decoded images;
- ``crop_flip`` is torchvision's PIL path written out (torchvision's wheel does not import beside
  this torch): ``RandomResizedCrop.get_params`` (packer's re-implementation), ``crop`` +
  ``resize(BILINEAR)``, a flip with probability 0.5, ``PILToTensor``.

Page cache warm (read once before each pass), shuffled, one epoch per pass in a fresh process,
readers interleaved, medians of ``--repeats``. Target: packer ≥ 1.3 × the best peer.

    PYTHONPATH=$PWD /work/benchvenv/bin/python benchmarks/training_peers.py --samples 5000
"""

from __future__ import annotations

import io
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from fields_read import _files, _log, answered_one_pass, data_parser, packed_set, run_pass

READERS = ("packer.lmdb", "packer.npy", "webdataset", "litdata", "streaming", "hf")


def crop_flip(image: Any) -> Any:
    """torchvision's RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor, on a PIL image."""
    import numpy as np
    import torch
    from PIL import Image

    from packer.transforms import crop_params

    top, left, h, w = crop_params(image.width, image.height, (0.08, 1.0), (3 / 4, 4 / 3))
    out = image.crop((left, top, left + w, top + h)).resize((224, 224), Image.Resampling.BILINEAR)
    if torch.rand(1).item() < 0.5:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(out).copy()).permute(2, 0, 1).contiguous()


def _pil(data: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def make_mds(files: Path, out: Path) -> Path:
    """The samples as MosaicML Streaming MDS shards (made once)."""
    if (out / "index.json").is_file():
        return out
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"jpg": "bytes", "txt": "str"}, size_limit="16mb") as w:
        for jpg in sorted(files.glob("*.jpg")):
            w.write({"jpg": jpg.read_bytes(), "txt": jpg.with_suffix(".txt").read_text()})
    return out


def make_hf(files: Path, out: Path) -> Path:
    """The samples as a Hugging Face dataset on disk (Arrow; made once)."""
    if (out / "dataset_info.json").is_file():
        return out
    import datasets

    jpgs = sorted(files.glob("*.jpg"))
    features = datasets.Features({"jpg": datasets.Image(), "txt": datasets.Value("string")})
    table = {
        "jpg": [{"bytes": p.read_bytes(), "path": None} for p in jpgs],
        "txt": [p.with_suffix(".txt").read_text() for p in jpgs],
    }
    datasets.Dataset.from_dict(table, features=features).save_to_disk(str(out))
    return out


def _hf_transform(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
    return {"jpg": [crop_flip(image) for image in batch["jpg"]], "txt": batch["txt"]}


def _loader(reader: str, source: Path, workers: int, seed: int) -> Any:
    import torch
    from torch.utils.data import DataLoader

    if reader.startswith("packer"):
        import packer
        from packer.transforms import RandomResizedCrop

        crop = RandomResizedCrop(224, hflip=0.5)
        dataset = packer.open_dataset(source, fields=("jpg", "txt"), transform={"jpg": crop})
        return DataLoader(dataset, batch_size=64, shuffle=True, num_workers=workers)
    if reader == "webdataset":
        import webdataset as wds

        urls = [str(p) for p in _files(source)]
        dataset = wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
        dataset = dataset.shuffle(1000).decode("pil").to_tuple("jpg", "txt")
        dataset = dataset.map_tuple(crop_flip, lambda text: text)
        return DataLoader(dataset, batch_size=64, num_workers=workers)
    if reader == "litdata":
        import litdata

        class LitImages(litdata.StreamingDataset):  # type: ignore[misc]
            def __getitem__(self, index: Any) -> Any:
                item = super().__getitem__(index)
                return crop_flip(_pil(item["jpg"])), item["txt"]

        return litdata.StreamingDataLoader(
            LitImages(str(source), shuffle=True, seed=seed), batch_size=64, num_workers=workers
        )
    if reader == "hf":
        import datasets

        dataset = datasets.load_from_disk(str(source)).with_transform(_hf_transform)
        return DataLoader(dataset, batch_size=64, shuffle=True, num_workers=workers)
    import streaming

    class MDSImages(streaming.StreamingDataset):  # type: ignore[misc]
        def __getitem__(self, index: int) -> Any:
            item = super().__getitem__(index)
            return crop_flip(_pil(item["jpg"])), item["txt"]

    streaming.base.util.clean_stale_shared_memory()
    dataset = MDSImages(local=str(source), shuffle=True, shuffle_seed=seed, batch_size=64)
    return torch.utils.data.DataLoader(dataset, batch_size=64, num_workers=workers)


def one_pass(cfg: dict[str, Any]) -> dict[str, Any]:
    """One warm epoch of one reader in this (fresh) process: samples and seconds."""
    import torch

    torch.manual_seed(cfg["seed"])
    source = Path(cfg["path"])
    for path in _files(source):
        path.read_bytes()
    loader = _loader(cfg["reader"], source, cfg["workers"], cfg["seed"])
    start, count = time.perf_counter(), 0
    for batch in loader:
        images, captions = (batch["jpg"], batch["txt"]) if isinstance(batch, dict) else batch
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 224, 224), images.shape
        assert len(captions) == len(images)
        count += len(images)
    return {"samples": count, "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    parser = data_parser(__doc__ or "")
    parser.add_argument("--readers", nargs="+", default=list(READERS), choices=READERS)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if answered_one_pass(args, one_pass):
        return 0
    paths, work = packed_set(args), args.root / f"n{args.samples}"
    targets = {"webdataset": paths["tars"], "litdata": paths["litdata"]}
    targets.update({"packer.npy": paths["npy"], "packer.lmdb": paths["lmdb"]})
    if "streaming" in args.readers:
        targets["streaming"] = make_mds(paths["files"], work / "mds")
    if "hf" in args.readers:
        targets["hf"] = make_hf(paths["files"], work / "hf")
    rates: dict[str, list[float]] = {reader: [] for reader in args.readers}
    for repeat in range(args.repeats):
        for reader in args.readers:
            cfg = {"reader": reader, "path": str(targets[reader]), "seed": repeat,
                   "workers": args.workers}  # fmt: skip
            got = run_pass(__file__, cfg)
            assert got["samples"] == args.samples, (reader, got)
            rates[reader].append(got["samples"] / got["seconds"])
            _log(f"round {repeat + 1} {reader:12} {rates[reader][-1]:7,.0f} images/s")
    medians = {reader: statistics.median(v) for reader, v in rates.items()}
    peers = {r: v for r, v in medians.items() if not r.startswith("packer")}
    best_peer = max(peers, key=peers.__getitem__) if peers else None
    best_packer = max((r for r in medians if r.startswith("packer")), key=medians.__getitem__)
    print(f"\n| reader | images/s (median of {args.repeats}) | × best peer |\n|---|--:|--:|")
    for reader, rate in medians.items():
        ratio = f"{rate / peers[best_peer]:.2f}" if best_peer else "—"
        print(f"| {reader} | {rate:,.0f} | {ratio} |")
    if best_peer:
        ratio = medians[best_packer] / peers[best_peer]
        verdict = "met" if ratio >= 1.3 else "missed"
        print(f"\n{best_packer} / {best_peer}: {ratio:.2f} (target ≥ 1.3: {verdict})")
    if args.out is not None:
        report = {"samples": args.samples, "workers": args.workers, "runs": rates,
                  "medians": medians}  # fmt: skip
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "training_peers.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
