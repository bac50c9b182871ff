"""Issue 42 item 5: the smaller first-day fixes, each through the public API or CLI."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

import packer.decode.registry as registry
from packer.decode.registry import pillow_rgb


def test_16_bit_grayscale_is_scaled_by_1_over_257_and_the_docs_say_so() -> None:
    wide = np.array([[0, 257, 32896, 65535]], dtype=np.uint16)
    buffer = io.BytesIO()
    Image.fromarray(wide).save(buffer, format="PNG")
    pixels = np.asarray(pillow_rgb(buffer.getvalue()))[0, :, 0]
    assert pixels.tolist() == [0, 1, 128, 255]  # ImageFolder would clip to 0, 255, 255, 255
    doc = " ".join((registry.__doc__ or "").split())
    assert "1/257" in doc and "clips" in doc
    assert "1/257" in (Path(__file__).parent.parent / "docs" / "converting.md").read_text()


def test_shell_completion_script_is_produced_as_documented() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "cli.md").read_text()
    assert "_PACKER_COMPLETE=bash_source packer" in doc
    packer_cli = Path(sys.executable).with_name("packer")
    for shell in ("bash", "zsh", "fish"):
        done = subprocess.run(
            [str(packer_cli)],
            env={"_PACKER_COMPLETE": f"{shell}_source", "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "_PACKER_COMPLETE" in done.stdout and "complete" in done.stdout, shell


def test_the_key_is_accepted_as_a_field(tmp_path: Path) -> None:
    import packer
    from packer.demo.fields import make_caption_set

    written = make_caption_set(tmp_path / "pairs", 6, seed=1)
    dst = tmp_path / "pairs.lmdb"
    packer.convert(tmp_path / "pairs", dst, progress=False)
    keys_only = packer.open_dataset(dst, fields=("__key__",))
    assert keys_only.fields == ("__key__",)
    assert sorted(keys_only[i][0] for i in range(len(keys_only))) == sorted(written)
    pairs = packer.open_dataset(dst, fields=("txt", "__key__"))
    for i in range(len(pairs)):
        caption, key = pairs[i]
        assert caption == written[key]["txt"].decode()
    from torch.utils.data import DataLoader

    batches = list(DataLoader(pairs, batch_size=4, collate_fn=packer.collate_fields))
    assert sorted(k for _, keys in batches for k in keys) == sorted(written)
