"""A clean stop for ``cascade serve`` on LitServe: SIGTERM or Ctrl-C stops accepting, answers what is in
flight, and exits 0 with no traceback from any of the server's processes (docs/DESIGN.md 'Serving').

LitServe 0.2.19 runs a main process (waiting on a Manager event), forked HTTP processes (uvicorn and the
guard), one spawned inference process (the engine) and a Manager process (the queues between them). Its
own shutdown closes the queues, then stops the HTTP processes, then the worker; so left to it, a request
in flight could lose its answer, a Ctrl-C (which reaches the whole process group) killed the worker with
a ``KeyboardInterrupt`` traceback, and the HTTP processes, which inherit the main process's handlers,
printed one when uvicorn re-raised the signal it had captured.

Here the order is: (1) the main process closes its copy of the listening socket and sends SIGTERM to the
HTTP processes, whose uvicorn closes theirs (no new connection is taken) and finishes the requests it
holds while the worker still answers them; (2) once they have exited (or after uvicorn's grace),
LitServe's own shutdown runs (a ``KeyboardInterrupt`` in the main process) and terminates the worker, which
nothing reaches any more. A signal that reaches the whole process group (Ctrl-C; systemd's SIGTERM) must
not end the Manager or the worker before the drain: the HTTP processes exit quietly on it once uvicorn
has drained, the Manager (forked, so it inherits the handler) ignores it while the main process lives, and
the worker ignores SIGINT and SIGTERM while its parent lives and exits quietly on ``STOP_SIGNAL``, which the
main process sends once the HTTP processes are done; orphaned, it exits on SIGTERM.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from typing import Any

import litserve as ls

WORKER_NAME = "inference-worker"  # the name LitServe 0.2.19 gives its inference processes
FRONT_PREFIX = "LitServer-"  # and its HTTP processes
SIGNALS = (signal.SIGTERM, signal.SIGINT)
STOP_SIGNAL = signal.SIGUSR1  # the main process to the worker: nothing is in flight any more, exit


class StoppableServer(ls.LitServer):
    """A LitServer that keeps its listening sockets and HTTP processes, so a signal can stop them in order."""

    listening: list[socket.socket]
    fronts: list[BaseProcess]

    def _start_server(self, port: int, num_uvicorn_servers: int, log_level: str, sockets: list[socket.socket],
                      *args: Any, **kwargs: Any) -> dict[int, Any]:
        self.listening = list(sockets or [])
        workers = super()._start_server(port, num_uvicorn_servers, log_level, sockets, *args, **kwargs)
        self.fronts = [w for w in workers.values() if isinstance(w, BaseProcess)]
        return workers


def _exit_quietly(signum: int, frame: Any) -> None:
    raise SystemExit(0)  # multiprocessing ends the process with status 0 and prints nothing


def quiet_worker() -> None:
    """In LitServe's inference process: a SIGINT or SIGTERM sent to the whole process group leaves it
    answering what is in flight until the main process, draining, sends ``STOP_SIGNAL``; an orphaned worker
    (its parent gone) exits on SIGTERM. Elsewhere (a test calling ``setup``), nothing changes."""
    if mp.current_process().name != WORKER_NAME:
        return
    parent = os.getppid()

    def on_term(signum: int, frame: Any) -> None:
        if os.getppid() != parent:
            raise SystemExit(0)  # orphaned: no one will stop this process in order

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(STOP_SIGNAL, _exit_quietly)


def drain(server: Any, grace_s: float) -> list[int | None]:
    """Stop taking connections and let the HTTP processes finish the requests they hold (at most
    ``grace_s``); their exit codes (None: still running after the grace)."""
    for sock in getattr(server, "listening", []):
        try:
            sock.close()  # the HTTP processes hold their own copies: they close them as uvicorn shuts down
        except OSError:
            pass
    fronts = getattr(server, "fronts", [])
    for front in fronts:
        if front.is_alive() and front.pid is not None:
            os.kill(front.pid, signal.SIGTERM)  # uvicorn's graceful shutdown: the requests held are answered
    until = time.monotonic() + grace_s
    for front in fronts:
        front.join(max(0.0, until - time.monotonic()))
    for worker in getattr(server, "inference_workers", []):
        if worker.is_alive() and worker.pid is not None:
            os.kill(worker.pid, STOP_SIGNAL)  # nothing can reach it any more
            worker.join(5)
    return [front.exitcode for front in fronts]


@contextmanager
def stopping_on_signals(server: Any, grace_s: float | None = None) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT stop ``server`` (a :class:`StoppableServer` being run) in order:
    :func:`drain`, then LitServe's own shutdown. A second signal during the drain stops at once. On the
    way out, an inference process still alive is ended (it ignores SIGINT and SIGTERM)."""
    main, stopping = os.getpid(), []
    grace = (getattr(server, "uvicorn_graceful_timeout", 30) + 5) if grace_s is None else grace_s

    def handler(signum: int, frame: Any) -> None:
        if os.getpid() != main:  # a forked process: it inherited this handler
            if not mp.current_process().name.startswith(FRONT_PREFIX) and os.getppid() == main:
                return  # the Manager: its queues must outlive the drain; LitServe's shutdown ends it
            raise SystemExit(0)  # an HTTP process, after uvicorn's graceful shutdown re-raised the signal
        if stopping:
            raise KeyboardInterrupt  # a second signal: stop now
        stopping.append(signum)
        drain(server, grace)
        # LitServe's shutdown would warn that the HTTP processes are gone already, and its monitor thread
        # can log the closed Manager as a crash while the process exits: neither is news here
        logging.getLogger("litserve").setLevel(logging.CRITICAL)
        raise KeyboardInterrupt  # LitServe's own shutdown: the queues, the worker, the Manager

    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        for worker in getattr(server, "inference_workers", []):
            if worker.is_alive() and worker.pid is not None:
                os.kill(worker.pid, STOP_SIGNAL)
                worker.join(5)
