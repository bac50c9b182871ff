"""What ``packer bench`` runs: the sweep over formats and loader settings, its tables and plot,
the storage cost per sample and the resized copy it compares against.

Built on :mod:`packer.diagnosis` (timing, stalls, IO counters, measurement modes); only the command
line imports it.
"""
