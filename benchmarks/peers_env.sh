#!/usr/bin/env bash
# Make the benchmark-only venv that benchmarks/remote.py runs in: the project's venv (torch,
# packer's dependencies, s3fs, moto) seen through a .pth file, plus the peers it compares with,
# LitData 0.2.76, MosaicML Streaming 0.13.0, WebDataset 1.0.2 and HF datasets 5.2.0, and the few of their
# dependencies they import.
# Kept apart from the project's venv: the peers pin and pull packages packer does not need.
#
#   benchmarks/peers_env.sh [VENV]        (default /work/benchvenv; PROJECT_VENV=.venv)
#   PYTHONPATH=$PWD VENV/bin/python benchmarks/remote.py --images 500 --repeats 1
#
# The peers are installed with --no-deps (their full requirement lists would replace torch),
# then the two packages whose wheels must match the others are installed with torch pinned to
# the project's. torchvision is replaced by a stand-in package: its wheel does not import beside
# the project's CPU torch, and Streaming imports it at top level only for vision helpers the
# benchmark never calls.
set -euo pipefail

VENV=${1:-/work/benchvenv}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PROJECT_VENV=${PROJECT_VENV:-$HERE/.venv}
[ -x "$PROJECT_VENV/bin/python" ] || PROJECT_VENV=/work/main/.venv
PY="$PROJECT_VENV/bin/python"

"$PY" -m venv --system-site-packages "$VENV"
purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
project_site=$("$PY" -c "$purelib")
venv_site=$("$VENV/bin/python" -c "$purelib")
echo "$project_site" > "$venv_site/main_venv.pth"

"$VENV/bin/pip" install -q --no-deps litdata==0.2.76 mosaicml-streaming==0.13.0 webdataset==1.0.2 \
    braceexpand lightning-utilities obstore tifffile catalogue zstd python-snappy Brotli \
    transformers tokenizers safetensors huggingface-hub regex \
    datasets==5.2.0 dill multiprocess pandas python-dateutil pytz tzdata
torch_version=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
pin=$(mktemp)
echo "torch==$torch_version" > "$pin"
"$VENV/bin/pip" install -q -c "$pin" huggingface-hub cramjam
rm -f "$pin"

stand_in="$venv_site/torchvision"
mkdir -p "$stand_in/transforms"
cat > "$stand_in/__init__.py" <<'EOF'
"""Benchmark-only stand-in: torchvision's PyPI wheel does not import beside the project's CPU
torch, and mosaicml-streaming imports it at top level (only its vision helpers use it; the
benchmark does not)."""
EOF
cat > "$stand_in/datasets.py" <<'EOF'
import torch.utils.data


class VisionDataset(torch.utils.data.Dataset):
    pass


class CIFAR10(VisionDataset):
    pass
EOF
: > "$stand_in/transforms/__init__.py"
cat > "$stand_in/transforms/functional.py" <<'EOF'
def to_tensor(pic):
    raise NotImplementedError("benchmark stand-in")
EOF

"$VENV/bin/python" -c '
import datasets, litdata, streaming, torch, s3fs, moto, webdataset
from streaming import MDSWriter, StreamingDataset
print("peers venv ready: litdata", litdata.__version__, "streaming", streaming.__version__, "webdataset", webdataset.__version__,
      "datasets", datasets.__version__, "torch", torch.__version__)'
