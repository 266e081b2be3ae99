"""``python -m tvmrnn.tune.rpc_server``: TVM's RPC server for tuning, each session served in the
server's own process. Start one a device behind one tracker (``CUDA_VISIBLE_DEVICES=i`` for GPU
``i``) and tune with ``tvmrnn-tune --rpc-tracker HOST:PORT --rpc-key KEY``.

Why not ``python -m tvm.exec.rpc_server``: TVM 0.27's server runs each session (MetaSchedule opens
one a candidate) in a forked process, and on the H100 machine every CUDA measurement in such a
session failed (``cudaErrorInitializationError``); with ``--no-fork`` it spawns a new Python a
session instead, ~7 s each whatever the kernel (notes/performance.md v36). Here a session runs in
the server process (TVM's ``server_init_callback`` swaps the per-session process for a call), so
TVM and the device start once. A faulting kernel can leave a CUDA context unusable for every later
session, so after each session the server checks its GPU (where it has used one) and, where the
check fails, exits; this command then starts a new server, which registers with the tracker again.
A session that hangs is not cut off (TVM's ``--timeout`` needs a process to kill); MetaSchedule's
runner gives up on it after its session timeout.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import time
import types

logger = logging.getLogger("tvmrnn.rpc_server")


class _Descriptor:
    """A socket as TVM's server loop uses it: its descriptor."""

    def __init__(self, fd: int):
        self._fd = fd

    def fileno(self) -> int:
        return self._fd


class _InProcess:
    """What ``tvm.rpc.server`` takes for ``multiprocessing.Process``: runs the session on start."""

    def __init__(self, target, args=()):
        self._target, self._args = target, args
        self.exitcode, self.pid = None, os.getpid()

    def start(self):
        sock, *rest = self._args
        # TVM's server loop takes the socket's descriptor and may close it when the session ends;
        # it gets a duplicate, and the caller closes its own socket as it would after a fork
        fd = os.dup(sock.fileno())
        try:
            self._target(_Descriptor(fd), *rest)
        except Exception:  # noqa: BLE001 - the client sees the session fail; the server keeps serving
            logger.exception("tvmrnn rpc_server: the session failed")
        finally:
            try:
                os.fstat(fd)
                os.close(fd)
            except OSError:  # closed by the session already
                pass
        self.exitcode = 0
        _exit_if_the_gpu_is_broken()

    def join(self, timeout=None):
        pass

    def is_alive(self):
        return False


def _exit_if_the_gpu_is_broken():
    """After a session: where this process has a CUDA device, a synchronisation must succeed;
    otherwise (a kernel faulted and the context is lost) the process exits to be restarted."""
    import tvm
    try:
        dev = tvm.cuda(0)
        if not dev.exist:
            return
        dev.sync()
    except Exception as e:  # noqa: BLE001
        logger.error("tvmrnn rpc_server: the GPU is unusable after the session (%s); restarting", e)
        os._exit(3)


def _serve_in_process():
    """``server_init_callback``: runs in TVM's server process before it listens."""
    from tvm.rpc import server

    from ..schedules import bf16
    server.multiprocessing = types.SimpleNamespace(Process=_InProcess)
    bf16.request_amx()  # sessions run in this process: its AMX permission is theirs (bf16 kernels)


def start(host: str, port: int, port_end: int, tracker: str | None, key: str, silent: bool = False):
    """One TVM RPC server whose sessions run in its own process; returns ``tvm.rpc.Server``."""
    from tvm import rpc
    tracker_addr = None
    if tracker:
        thost, _, tport = tracker.rpartition(":")
        tracker_addr = (thost, int(tport))
    return rpc.Server(host=host, port=port, port_end=port_end, tracker_addr=tracker_addr, key=key, silent=silent,
                      server_init_callback=_serve_in_process)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tvmrnn.tune.rpc_server", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=9090)
    p.add_argument("--port-end", type=int, default=9199)
    p.add_argument("--tracker", help="HOST:PORT of the RPC tracker to register with")
    p.add_argument("--key", default="", help="the device key to register under (tvmrnn-tune's --rpc-key)")
    p.add_argument("--silent", action="store_true")
    a = p.parse_args(argv)
    if a.tracker and not a.tracker.rpartition(":")[2].isdigit():
        p.error(f"--tracker: expected HOST:PORT, got {a.tracker!r}")
    logging.basicConfig(level=logging.INFO)
    # TVM's server runs in a child process of this one: a SIGTERM (kill PID) must stop it too, not
    # leave it serving with no parent (v37: a killed server kept taking sessions)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    server = start(a.host, a.port, a.port_end, a.tracker, a.key, a.silent)
    logger.info("tvmrnn rpc_server on port %d (key %r), sessions in process", server.port, a.key)
    try:
        while True:
            time.sleep(1)
            if not server.proc.is_alive():  # it exited after a session broke its GPU: start afresh
                logger.warning("tvmrnn rpc_server: the server process ended; starting a new one")
                server = start(a.host, a.port, a.port_end, a.tracker, a.key, a.silent)
    except KeyboardInterrupt:
        pass
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
