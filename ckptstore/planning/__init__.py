"""Pure calculators over measured figures, torch-free and storage-free: ``models`` (failure
odds, optimal intervals, goodput), ``checks`` (input validation), ``goodput`` (a run's plan and
cost account, the calculator ``ckptstore-tool goodput`` renders)."""
