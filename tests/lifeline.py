"""``python tests/lifeline.py -m MODULE ARGS...``: run MODULE as ``python -m`` would, and
end it when the process that started it dies.

A test run killed by SIGKILL (a timeout, a helper's interrupted run) runs no fixture
teardown, so the simulators it started lived on under init. A thread polls the parent's
pid: when the parent is gone, the process gets SIGTERM, which the simulator answers with
its own clean shutdown, and exits for good a few seconds later if that hangs. Polling, not
``PR_SET_PDEATHSIG``: that one follows the thread that forked, and needs ``preexec_fn``,
which may deadlock a child forked from a threaded test process.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time

POLL_S = 0.5
GRACE_S = 5.0


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_S)
    os._exit(1)


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        raise SystemExit("usage: lifeline.py -m MODULE [ARGS...]")
    threading.Thread(target=_watch, args=(os.getppid(),), daemon=True).start()
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    sys.path[0] = os.getcwd()  # as ``python -m`` has it, not this script's directory
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
