"""The external peer data loaders (Mosaic Streaming, litdata, fsspec) for data.vs_peers.

setup.sh builds their own interpreter (benchmarks/peers/.venv); convert.py writes each
peer's format from the same rows; rank.py is one rank of a run; contenders.py each loader.
"""
