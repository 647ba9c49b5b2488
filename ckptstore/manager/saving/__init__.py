"""The background save of ``CheckpointManager``: from training's state to a committed step.

Backend selection (``backend``: a thread, or a writer process per rank), the two staging
arenas (``host_arena`` in this process, ``shared_arena`` in shared memory for the writer
process, both over ``slots`` and ``hostcopy``), the writer process (``writer_process``,
``writer_child``, ``writer_main``, ``writer_protocol``), ``save_step`` (the one save path
both backends end in) and the write schedules it gives the DCP writer (``schedule``).
Nothing here is public API: ``CheckpointManager`` is.
"""
