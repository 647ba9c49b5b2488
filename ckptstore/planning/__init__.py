"""Pure calculators over measured figures (``goodput``: checkpoint interval, lost work,
goodput); torch-free and storage-free."""
