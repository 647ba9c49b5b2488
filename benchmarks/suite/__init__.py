"""The benchmark suite: ``python -m benchmarks.suite --config quick|medium|full``.

config (the scenarios), scenarios (each kind runs one benchmark and returns records),
report (tables, plots); ``__main__`` runs them and can write README.md's current table.
"""
