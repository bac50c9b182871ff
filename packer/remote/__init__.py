"""Datasets at a URL: the one retried client (`storage`), the obstore backend, the open of a remote
dataset's manifest and tables, ranged record readers and the node-local shard cache.
"""
