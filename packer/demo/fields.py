"""The demo's samples with fields, made by the generator the tests use: an image–caption set as
key-grouped files (:func:`make_caption_set`), the same samples as WebDataset tars
(:func:`write_shards`) and as a table (:func:`write_table`), and a small COCO set
(:func:`make_coco_set`); :func:`run_fields_demo` converts them for ``packer demo --kind fields``.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from packer.demo.image import photo_like

__all__ = ["make_caption_set", "make_coco_set", "run_fields_demo", "write_shards", "write_table"]


def make_caption_set(
    root: str | os.PathLike[str],
    samples: int = 40,
    size: tuple[int, int] = (96, 72),
    seed: int = 0,
) -> dict[str, dict[str, bytes]]:
    """Write key-grouped samples with fields, as WebDataset names them: ``root/NNNNNN.jpg``
    (a photo-like JPEG), ``.txt`` (a caption, not all ASCII), ``.cls`` (an integer) and, for
    every other sample, ``.json`` (metadata: optional fields). Returns each key's fields' bytes.
    """
    rng = np.random.default_rng(seed)
    root_path = Path(root)
    root_path.mkdir(parents=True, exist_ok=True)
    words = ["a", "photo", "of", "the", "red", "café", "dog", "over", "a", "naïve", "hill"]
    written: dict[str, dict[str, bytes]] = {}
    for i in range(samples):
        key = f"{i:06d}"
        buffer = io.BytesIO()
        photo_like(rng, *size).save(buffer, format="JPEG", quality=90)
        fields = {
            "jpg": buffer.getvalue(),
            "txt": " ".join(rng.choice(words, size=int(rng.integers(3, 9)))).encode(),
            "cls": str(int(rng.integers(0, 10))).encode(),
        }
        if i % 2 == 0:
            fields["json"] = f'{{"id": {i}, "width": {size[0]}, "height": {size[1]}}}'.encode()
        for name, data in fields.items():
            (root_path / f"{key}.{name}").write_bytes(data)
        written[key] = fields
    return written


def write_shards(
    samples: dict[str, dict[str, bytes]], out: str | os.PathLike[str], per_shard: int = 16
) -> list[Path]:
    """Write ``samples`` (key -> field -> bytes) as WebDataset writes them: ``out/NNNNNN.tar``
    shards of ``per_shard`` samples each, a sample's members side by side (``KEY.FIELD``)."""
    import tarfile

    out_path = Path(out)
    out_path.mkdir(parents=True, exist_ok=True)
    keys = sorted(samples)
    shards = []
    for n, start in enumerate(range(0, len(keys), per_shard)):
        shard = out_path / f"{n:06d}.tar"
        with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
            for key in keys[start : start + per_shard]:
                for name, data in sorted(samples[key].items()):
                    info = tarfile.TarInfo(f"{key}.{name}")
                    info.size, info.mtime, info.mode = len(data), 0, 0o644
                    tar.addfile(info, io.BytesIO(data))
        shards.append(shard)
    return shards


def write_table(samples: dict[str, dict[str, bytes]], table: str | os.PathLike[str]) -> Path:
    """Write ``samples`` as a table beside their images: ``images/KEY.jpg`` and one row per
    sample (``key``, ``image``, ``caption``, ``label``, and ``json`` in JSONL and Parquet) in
    CSV, TSV, JSONL or Parquet by ``table``'s suffix."""
    path = Path(table)
    (path.parent / "images").mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for key in sorted(samples):
        fields = samples[key]
        (path.parent / "images" / f"{key}.jpg").write_bytes(fields["jpg"])
        row: dict[str, Any] = {"key": key, "image": f"images/{key}.jpg"}
        row["caption"], row["label"] = fields["txt"].decode(), int(fields["cls"])
        row["json"] = json.loads(fields["json"]) if "json" in fields else None
        rows.append(row)
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(
                handle,
                ["key", "image", "caption", "label"],
                delimiter="," if suffix == ".csv" else "\t",
            )
            writer.writeheader()
            writer.writerows({k: v for k, v in r.items() if k != "json"} for r in rows)
    elif suffix == ".jsonl":
        with open(path, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        for r in rows:
            r["json"] = json.dumps(r["json"]) if r["json"] is not None else None
        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def make_coco_set(
    root: str | os.PathLike[str], images: int = 12, size: tuple[int, int] = (80, 60), seed: int = 0
) -> dict[str, Any]:
    """Write a small COCO set: ``root/images/NNNNNNNNNNNN.jpg``, ``root/instances.json`` (two
    categories; boxes, polygons, one RLE crowd; the last image without annotations) and
    ``root/captions.json`` (two captions per image). Returns the two files' contents."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "images"
    folder.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    captions: list[dict[str, Any]] = []
    for i in range(images):
        name = f"{i + 1:012d}.jpg"
        photo_like(rng, *size).save(folder / name, format="JPEG", quality=90)
        entries.append({"id": i + 1, "file_name": name, "width": size[0], "height": size[1]})
        for j in range(2):
            captions.append({"id": 2 * i + j, "image_id": i + 1, "caption": f"photo {i} take {j}"})
        for j in range(0 if i == images - 1 else int(rng.integers(1, 4))):
            x, y = float(rng.integers(0, size[0] // 2)), float(rng.integers(0, size[1] // 2))
            note: dict[str, Any] = {"id": len(notes) + 1, "image_id": i + 1}
            note["category_id"], note["iscrowd"] = int(rng.integers(1, 3)), int(j == 2)
            note["bbox"], note["area"] = [x, y, 20.0, 10.0], 200.0
            if j == 2:
                note["segmentation"] = {"size": [size[1], size[0]], "counts": [x, 10, 30]}
            else:
                note["segmentation"] = [[x, y, x + 20, y, x + 20, y + 10, x, y + 10]]
            notes.append(note)
    categories = [
        {"id": 1, "name": "dog", "supercategory": "animal"},
        {"id": 2, "name": "café", "supercategory": "place"},
    ]
    instances = {"images": entries, "annotations": notes, "categories": categories}
    written = {"instances": instances, "captions": {"images": entries, "annotations": captions}}
    for name, content in written.items():
        (Path(root) / f"{name}.json").write_text(json.dumps(content, ensure_ascii=False))
    return written


def run_fields_demo(workdir: str | os.PathLike[str], samples: int, progress: bool) -> list[str]:
    """Write an image-caption set as key-grouped files, as WebDataset tars and as a CSV table,
    and a small COCO set; convert each (the files to LMDB, NPY and HDF5); read one sample back.
    The lines to show."""
    from packer.read.fields import FieldDataset
    from packer.write.convert import convert

    work = Path(workdir)
    source = work / "captions"
    written = make_caption_set(source, samples)
    shards = write_shards(written, work / "captions-tars")
    table = write_table(written, work / "captions-table" / "captions.csv")
    make_coco_set(work / "coco")
    lines = [f"generated {samples} samples (jpg, txt, cls, json on every other) in {source}"]
    lines.append(f"the same as {len(shards)} WebDataset tars in {shards[0].parent}, as {table}")
    lines.append(f"and a COCO set in {work / 'coco'}")
    jobs: list[tuple[Any, str, dict[str, Any]]] = [
        (source, f"captions{suffix}", {}) for suffix in (".lmdb", ".npy", ".h5")
    ]
    jobs.append((str(shards[0].parent / f"{{000000..{len(shards) - 1:06d}}}.tar"), "tars.npy", {}))
    jobs.append((table, "table.lmdb", {}))
    coco = [str(work / "coco" / f"{name}.json") for name in ("instances", "captions")]
    jobs.append((work / "coco" / "images", "coco.lmdb", {"annotations": coco}))
    for src, name, options in jobs:
        result = convert(src, work / name, overwrite=True, progress=progress, **options)
        lines.append(result.summary())
    sample = FieldDataset(work / "captions.lmdb")[0]
    shown = {k: (f"<{type(v).__name__}>" if k == "jpg" else v) for k, v in sample.items()}
    lines.append(f"\nopen_dataset({str(work / 'captions.lmdb')!r})[0] = {shown}")
    return lines
