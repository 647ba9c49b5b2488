"""Bytes, parts, checksums, manifests and commits over a ``Store``; never tensors.

The engine imports no torch and is usable alone (``ckptstore-tool cp`` and the data cache
use it without DCP). ``store`` is the contract every backend implements; ``transfer`` the
pool that writes and reads files as parallel parts; ``checksum``, ``manifest`` and
``commit`` how a checkpoint is checked and committed; ``layout``, ``paths`` and ``catalog``
what the names under a root are; ``copy``, ``verify`` and ``deletion`` the operations on
whole checkpoints; ``retry`` and ``crashpoints`` the failure handling and its tests.
"""
