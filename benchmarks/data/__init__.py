"""The data loader: wait per step, cache, hand-off, start-up, and the peers head to head.

loader (fsspec DataLoader vs ckptstore cold/warm cache), vs_peers (Mosaic Streaming, litdata,
fsspec; run with benchmarks/peers' interpreter; vs_peers_report holds its tables), handoff,
handoff_wait, cache_limit, client_start, rank_setup.
"""
