"""Pure calculators over measured figures, torch-free and storage-free: ``models`` (failure
odds, optimal intervals, goodput), ``checks`` (input validation), ``goodput`` (a run's plan and
cost account, the calculator ``ckptstore-tool goodput`` renders), ``scale`` (saves, restores,
request rates per key prefix and cost projected to 1k-100k GPUs, and the limit that binds:
``ckptstore-tool goodput --plan``; its inputs in ``scale_inputs``)."""
