"""ckptstore's benchmarks, by area: checkpoint/, objstore/, data/, peers/, suite/.

Run each as a module from the repository root, e.g. ``python -m benchmarks.checkpoint.local
--quick`` or ``python -m benchmarks.suite --config quick``; what they share (the state, the
order, RSS, the report) is ``benchmarks.common``. README.md holds the current figures.
"""
