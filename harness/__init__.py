"""The project's test harness (not installed with ckptstore): object-store server
launchers (``seaweedfs``, ``azurite``, ``fakegcs``, ``motoserver``, ``servers``,
``objstore``), a fault-injecting TCP proxy (``proxy``), multi-process runs (``dist``),
chaos runs under torchrun (``chaos``) and the checks made from them (``runlog``,
``ckptcheck``, ``goodput_report``). The tests, benchmarks and ``make demo`` import it
from the repository root."""
