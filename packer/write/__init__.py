"""The write side: a conversion planned, loaded in parallel, written shard by shard with
checkpoints, finished and published (`convert`), and the joining of `--part` outputs (`merge`).
"""
