"""The external peer data loaders (Mosaic Streaming, litdata, fsspec) for data.vs_peers.

setup.sh builds their own interpreter (benchmarks/peers/.venv); convert.py writes each
peer's format from the same rows; launch.py starts the ranks and rank.py is one of them;
contenders.py builds each loader.
"""
