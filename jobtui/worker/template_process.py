"""The template process of the handler processes: a forkserver of the worker's own.

A fresh interpreter (`python -c`), started by the worker's pool (children.py) before any job
runs, imports the app and prepares its registry once; every handler process is then forked
from it, ready at once. Nothing of the worker exists in it: no connection, pool, lock, thread
or event loop of the worker's was ever in this process to be inherited.

It speaks with the worker over two SEQPACKET sockets (one message each way per event):

* requests, worker to template: the setup first (app, sys.path), then one `fork` each, with
  the child's data and control sockets passed along (SCM_RIGHTS);
* reports, template to worker: `ready` or `broken`, then `forked` (pid) per request and
  `exited` (pid, exit code: negative for a signal) per child that ended.

When the worker goes, its sockets close: the template exits, and each child's watchdog
(child.py) ends a child still running a job.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import socket
import sys
from typing import Any

MESSAGE = 1 << 16


def _send(reports: socket.socket, message: object) -> None:
    reports.send(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def serve(requests: socket.socket, reports: socket.socket) -> None:
    setup = pickle.loads(requests.recv(MESSAGE))
    sys.path[:] = setup["sys_path"]
    from jobtui.core.middleware import prepared
    from jobtui.core.registry import load_app
    from jobtui.worker import child

    try:
        jobs = prepared(load_app(setup["settings"].app))
    except Exception as exc:  # InvalidInput, or anything the app's import raised
        _send(reports, ("broken", f"{type(exc).__name__}: {exc}"))
        return
    child.setup_logging(setup["settings"])
    _send(reports, ("ready", os.getpid()))
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd is written
    # Ctrl-C, or a SIGTERM to the process group or cgroup (systemd), reaches this process too:
    # the worker decides, and this process ends when the worker closes its socket.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        readable, _, _ = select.select([requests.fileno(), wake_r], [], [], 1.0)
        if wake_r in readable:
            os.read(wake_r, 512)
        _reap(reports)
        if requests.fileno() not in readable:
            continue
        try:
            message, fds, _, _ = socket.recv_fds(requests, MESSAGE, 2)
        except OSError:
            message, fds = b"", []
        if not message:
            return  # the worker is gone
        number = pickle.loads(message)[1]
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (wake_r, wake_w):
                    os.close(fd)
                requests.close()
                reports.close()
                data, control = (socket.socket(fileno=fd) for fd in fds)
                child.main(data, control, setup["settings"], jobs)
                code = 0
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        _send(reports, ("forked", number, pid))


def _reap(reports: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(reports, ("exited", pid, os.waitstatus_to_exitcode(status)))


def main(argv: list[str] | None = None) -> None:
    """`python -c 'from jobtui.worker.template_process import main; main()' REQUESTS_FD REPORTS_FD`"""
    args: Any = argv if argv is not None else sys.argv[1:]
    requests = socket.socket(fileno=int(args[0]))
    reports = socket.socket(fileno=int(args[1]))
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the worker went away
        serve(requests, reports)
