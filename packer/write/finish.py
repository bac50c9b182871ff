"""What a run finds at its destination once it holds the lock, and the end of a conversion.

A kill can stop a conversion at any step of its end (see :mod:`packer.write.destination` for the
sequence). Each state it leaves is recognised here:

- ``DST.partial/`` with a valid ``packer.json`` whose tables match their checksums and whose
  shards have their sizes: *complete but unpublished*. The same conversion (format, options,
  source; the fingerprint in ``_progress/`` while it is there, else the manifest and the inputs'
  modification times) publishes it, with ``--resume`` or without; another one is refused.
- ``DST`` alone, with ``--resume``: *already published*; the same conversion answers
  "complete", another one is refused as ``destination exists``.
- anything else: the ordinary pipeline (``--resume`` continues from the checkpoints).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packer.core.manifest import MANIFEST_NAME, Manifest
from packer.errors import DestinationError, PackerError
from packer.read.store import open_packed
from packer.write.destination import partial_path, publish
from packer.write.resume import Progress, changed_inputs, describe_change, name_change

__all__ = ["Found", "complete_output", "find_finished", "manifest_difference", "publish_finished"]


@dataclass
class Found:
    """A finished conversion found at the destination: ``published`` (``DST``) or not yet
    (``DST.partial``)."""

    manifest: Manifest
    published: bool


def complete_output(path: Path) -> Manifest | None:
    """The manifest of the complete output at ``path``: its manifest loads, its tables and keys
    match the manifest's checksums, its shards have their recorded sizes. None otherwise."""
    if path.is_symlink() or not (path / MANIFEST_NAME).is_file():
        return None
    try:  # the manifest, the tables hashed against it, the shards' sizes; no data file opened
        return open_packed(path).manifest
    except (PackerError, OSError, ValueError):
        return None


def _json(data: Any) -> Any:
    return json.loads(json.dumps(data))


def _difference(path: Path, manifest: Manifest, fp: dict[str, Any], source: Any) -> str | None:
    """What differs between the finished output at ``path`` and this run (None: nothing)."""
    recorded = Progress(path).fingerprint()
    if recorded is not None:  # the interrupted run's own fingerprint: the full comparison
        return name_change(describe_change(recorded[0], _json(fp)), source, recorded[1])
    written = (path / MANIFEST_NAME).stat().st_mtime_ns
    return manifest_difference(manifest, fp, source, written, str(path))


def manifest_difference(
    manifest: Manifest, fp: dict[str, Any], source: Any, written: int, where: str
) -> str | None:
    """What differs between the output ``manifest`` describes (written at ``written`` ns, at
    ``where``: a folder or a URL) and this run's fingerprint ``fp`` (None: nothing)."""
    options = {k: v for k, v in manifest.options.items() if k != "storage"}
    old = {
        "format": manifest.format,
        "options": options,
        "root": manifest.source.get("root"),
        "classes": len(manifest.classes),
        "bytes": manifest.source.get("bytes"),
    }
    new = {k: v for k, v in _json(fp).items() if k in old}
    change = describe_change(old, new)
    if change is None and fp.get("newest_mtime_ns", 0) > written:
        paths = changed_inputs(source, written) if source is not None else ["?"]
        more = f" (and {len(paths) - 1} more)" if len(paths) > 1 else ""
        change = f"input {paths[0]!r}{more} was modified after {where!r} was written"
    return change


def find_finished(
    dst: Path, fp: dict[str, Any], source: Any, resume: bool, overwrite: bool
) -> Found | None:
    """The finished conversion of these inputs and options at ``dst`` (call with the lock
    held), None if the pipeline must run; raise if a finished one of another conversion is in
    the way."""
    partial = partial_path(dst)
    if (resume or not overwrite) and partial.is_dir():
        manifest = complete_output(partial)
        if manifest is not None:
            change = _difference(partial, manifest, fp, source)
            if change is None:
                return Found(manifest, published=False)
            raise DestinationError(
                f"{str(partial)!r} holds a finished conversion that was not published, of "
                f"other inputs or options ({change}); pass --overwrite to start over"
            )
    if resume and not overwrite and not partial.exists() and dst.is_dir():
        published = complete_output(dst)
        if published is None:
            change = "it is not a complete packer output (packer verify says why)"
        elif (change := _difference(dst, published, fp, source)) is None:
            return Found(published, published=True)
        raise DestinationError(
            f"destination {str(dst)!r} exists and there is nothing to resume: {change}; pass "
            "--overwrite to replace it"
        )
    return None


def publish_finished(found: Found, dst: Path) -> None:
    """Finish the end a kill interrupted: drop what is left of ``_progress/``, publish."""
    if not found.published:
        partial = partial_path(dst)
        Progress(partial).remove()
        publish(partial, dst)
