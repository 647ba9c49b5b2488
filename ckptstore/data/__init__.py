"""Data layer: dataset, loader, shard cache and the data-order math they share.

``ckptstore.data.order`` holds the pure order functions (no I/O, no torch): which sample
the loader serves at each step, resumable exactly on any world size and worker count.
"""
