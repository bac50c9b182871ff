"""Diagnosis: what ``packer doctor`` runs and the public :func:`packer.diagnose` and
:func:`packer.worker_init_fn`, next to what they measure (the timing loop, wait statistics and
stalls, kernel IO counters, worker threads, decoder advice, the measurement modes of a path).

Modules here may import the read and write sides; no lower floor imports them (only the command
line, the benchmarks' helpers, the demo and the lazy public names of :mod:`packer`).
"""
