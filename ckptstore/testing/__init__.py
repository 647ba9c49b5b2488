"""What a store's own tests can use, shipped with the library: ``faults.FaultyStore``
(fail, delay or corrupt the Nth call of any store method) and ``conformance`` (the store
contract as a test class: a third-party store's test is one subclass).

The project's own harness (server launchers, the fault proxy, chaos runs, run logs and
their reports) lives in the repository's ``harness/`` directory and is not installed."""
