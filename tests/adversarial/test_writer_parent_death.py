"""The ``background="process"`` writer exits within 1 s of its trainer's kill -9, at any
point of its life: while it imports torch, while it waits in the writers' rendezvous, and
idle. A writer started from a thread that ends must live on (Linux's parent-death signal
follows the thread that started a process, not the process).

Each case starts a real trainer process that starts a real writer, kills the trainer with
SIGKILL at the named point and polls the writer's pid for one second.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest

from tests.manager.test_background_process import gone

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")

TRAINER = """
import sys, threading, time
from ckptstore.manager.options import SaveOptions
from ckptstore.manager.saving.writer_process import BackgroundWriter
from ckptstore.manager.saving.writer_protocol import WriterSettings

root, when = sys.argv[1], sys.argv[2]
world = 2 if when == "rendezvous" else 1  # rank 1 never comes: the writer waits for it
settings = WriterSettings(root, SaveOptions(), 0, world_size=world)
broadcast = (lambda value: value) if when == "rendezvous" else None
if when == "from-a-thread":
    box = []
    t = threading.Thread(target=lambda: box.append(BackgroundWriter(settings, broadcast)))
    t.start()
    t.join()  # the thread that started the writer is gone
    bg = box[0]
else:
    bg = BackgroundWriter(settings, broadcast)
print(bg.writer.proc.pid, flush=True)
if when in ("idle", "from-a-thread"):
    bg.ensure_ready()
elif when == "rendezvous":
    while bg._store.num_keys() < 1:  # the writer has reached rank 0's rendezvous store
        time.sleep(0.05)
    time.sleep(0.5)  # and is blocked in init_process_group, waiting for rank 1
if when != "starting":
    print("at", when, flush=True)
time.sleep(300)
"""


def _line(proc: subprocess.Popen, timeout: float = 90.0) -> str:
    """The trainer's next line of output (fails, not hangs, if it never comes)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"the trainer said nothing for {timeout:.0f} s"
    return str(proc.stdout.readline()).strip()


def _seconds_to_exit(pid: int, limit: float = 1.0) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if gone(pid):
            return time.monotonic() - started
        time.sleep(0.01)
    return None


@pytest.mark.parametrize(
    "when",
    [
        "starting",
        "idle",
        pytest.param("rendezvous", marks=pytest.mark.slow),  # ~15 s each on 2 busy cores
        pytest.param("from-a-thread", marks=pytest.mark.slow),
    ],
)
@pytest.mark.processes
def test_writer_exits_within_1s_of_its_trainers_kill(tmp_path, when: str) -> None:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(tmp_path), when],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    writer = 0
    try:
        writer = int(_line(trainer))
        if when != "starting":  # else: kill at once, while the writer imports torch
            assert _line(trainer) == f"at {when}"
        assert not gone(writer), "the writer died before its trainer"
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait(timeout=30)
        took = _seconds_to_exit(writer)
        assert took is not None, f"the writer ({when}) outlived its killed trainer by over 1 s"
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        if writer and not gone(writer):
            os.kill(writer, signal.SIGKILL)
