"""The benchmarks' own measurement harness: sweeps, reports and helpers used only by the scripts in
``benchmarks/`` and by the tests. Not installed with packer (it is not part of the product); the
scripts import it as ``harness`` (``benchmarks/`` is their ``sys.path[0]``), the tests through
pytest's ``pythonpath``."""
