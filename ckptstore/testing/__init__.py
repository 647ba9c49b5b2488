"""Helpers the test suite (and users' own tests) use: multi-process runs, fault injection,
chaos runs under torchrun (``chaos``) and the checks made from them (``runlog``,
``ckptcheck``, ``goodput_report``)."""
