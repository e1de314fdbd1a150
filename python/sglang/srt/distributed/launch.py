"""Starting and watching the TP ranks of one node.

    node n of --nnodes runs ranks [n * k, (n + 1) * k), k = tp_size / nnodes; rank 0 (node 0) is the scheduler
    (scheduler_process.py, or the offline Engine's own process), every other rank a follower (tp_worker.py).
The ranks meet at --dist-init-addr (host:port; on one node a free port on 127.0.0.1 is picked when unset).
TpWorkers watches the followers this process started: `death()` names the first one that died and why (its own
"fatal" message when it reported one, else its exit code or the signal that killed it).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
from typing import List, Optional

from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

WORKER_STOP_TIMEOUT_S = 5.0
RANK_WATCH_INTERVAL_S = 0.2
# what a rank's error says when a peer died under it (gloo / nccl): a consequence, not the cause
COLLECTIVE_LOSS_MARKERS = ("Connection closed by peer", "Connection reset by peer", "NCCL", "gloo")


def ranks_of_node(sa: ServerArgs) -> List[int]:
    per_node = sa.tp_size // sa.nnodes
    return list(range(sa.node_rank * per_node, (sa.node_rank + 1) * per_node))


def free_local_addr() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def with_dist_init_addr(sa: ServerArgs) -> ServerArgs:
    """sa with --dist-init-addr set: unchanged when given (or tp == 1), else a free loopback port (one node)."""
    if sa.tp_size == 1 or sa.dist_init_addr:
        return sa
    return dataclasses.replace(sa, dist_init_addr=free_local_addr())


def check_tp_config(sa: ServerArgs) -> None:
    """Fail before any rank starts: heads / KV heads / intermediate / vocab sharding, model kind, devices present."""
    if sa.tp_size == 1:
        return
    from sglang.srt.mem_plan.model_shapes import model_shape_from_path
    from sglang.srt.model_loader import resolve_model_path

    shape = model_shape_from_path(resolve_model_path(sa))  # also converts a GGUF once, before the ranks read it
    t, tp = shape.text, sa.tp_size
    if shape.encoders:
        raise ValueError(f"--tp-size {tp}: multimodal models run on one rank only; use --tp-size 1.")
    if t.num_q_heads % tp:
        raise ValueError(f"--tp-size {tp} does not divide the model's {t.num_q_heads} attention heads; "
                         f"pick a divisor of {t.num_q_heads}.")
    if t.num_kv_heads % tp and tp % t.num_kv_heads:
        raise ValueError(f"--tp-size {tp} and the model's {t.num_kv_heads} KV heads: one must divide the other "
                         f"(KV heads are split, or replicated when tp > KV heads).")
    if t.intermediate_size % tp:
        raise ValueError(f"--tp-size {tp} does not divide the model's intermediate size {t.intermediate_size}.")
    per_node = tp // sa.nnodes
    device = sa.device
    if device in ("auto", "cuda", "hip"):
        import torch

        present = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if device != "auto" or present:
            if per_node > present:
                raise ValueError(f"--tp-size {tp} over --nnodes {sa.nnodes} needs {per_node} GPUs per node; "
                                 f"{present} present.")


class TpWorkers:
    """The follower ranks this process started, each with the pipe it reports through."""

    def __init__(self, sa: ServerArgs, ranks: List[int]):
        from sglang.srt.distributed.tp_worker import run_tp_worker

        ctx = mp.get_context("spawn")
        self.ranks = ranks
        self.procs, self.readers, self.messages = [], [], {}
        for rank in ranks:
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=run_tp_worker, args=(sa, rank, writer, os.getpid()), name=f"sglang-tp{rank}",
                               daemon=True)
            proc.start()
            writer.close()
            self.procs.append(proc)
            self.readers.append(reader)

    @property
    def pids(self) -> List[int]:
        return [p.pid for p in self.procs]

    def _drain(self) -> None:
        for rank, reader in zip(self.ranks, self.readers):
            try:
                while reader.poll():
                    self.messages[rank] = reader.recv()
            except (EOFError, OSError):
                pass

    def all_ready(self) -> bool:
        self._drain()
        return all(self.messages.get(r, {}).get("status") == "ready" for r in self.ranks)

    def _cause(self, rank: int, proc) -> str:
        msg = self.messages.get(rank, {})
        if msg.get("status") in ("fatal", "error"):
            return msg["message"]
        if proc.exitcode is not None and proc.exitcode < 0:
            return f"killed by {signal.Signals(-proc.exitcode).name}"
        return f"exited with code {proc.exitcode}"

    def death(self) -> Optional[str]:
        """'TP rank k (pid p) died: cause' for the follower that failed first, else None. When one rank dies the
        others fail in their next collective ("Connection closed by peer"): a rank killed by a signal or failing
        with its own error is named before those."""
        dead = [(rank, proc) for rank, proc in zip(self.ranks, self.procs) if not proc.is_alive()]
        if not dead:
            return None
        self._drain()

        def secondary(item) -> int:
            rank, proc = item
            if proc.exitcode is not None and proc.exitcode < 0:
                return 0
            return 2 if any(s in self._cause(rank, proc) for s in COLLECTIVE_LOSS_MARKERS) else 1

        rank, proc = min(dead, key=secondary)
        others = [r for r, _ in dead if r != rank]
        tail = f" (then rank(s) {others} stopped too)" if others else ""
        return f"TP rank {rank} (pid {proc.pid}) died: {self._cause(rank, proc)}{tail}"

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.all_ready():
            dead = self.death()
            if dead:
                raise RuntimeError(dead)
            if time.monotonic() > deadline:
                raise RuntimeError(f"TP ranks {self.ranks} did not start within {timeout_s:.0f} s")
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM every follower, then SIGKILL what is left after WORKER_STOP_TIMEOUT_S (one shared deadline)."""
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + WORKER_STOP_TIMEOUT_S
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(WORKER_STOP_TIMEOUT_S)


def start_node_workers(sa: ServerArgs) -> TpWorkers:
    """The followers of this node (rank 0 excluded: the caller runs it)."""
    return TpWorkers(sa, [r for r in ranks_of_node(sa) if r != 0])


class InProcessRankWatch:
    """For the offline Engine, whose own process is rank 0: the followers it started, and a thread that ends the
    process (exit code 1, the dead rank named in the log) when one dies, since rank 0 would wait for it forever."""

    def __init__(self, workers: TpWorkers):
        self.workers = workers
        self.stopping = threading.Event()
        # at interpreter exit multiprocessing terminates the (daemonic) followers: not a failure
        atexit.register(self.stopping.set)
        threading.Thread(target=self._watch, name="tp-rank-watch", daemon=True).start()

    def _watch(self) -> None:
        while not self.stopping.wait(RANK_WATCH_INTERVAL_S):
            dead = self.workers.death()
            if dead and not self.stopping.is_set():
                logger.error("%s; stopping (rank 0 cannot go on without it)", dead)
                self.workers.stop()
                logging.shutdown()
                os._exit(1)

    def stop(self) -> None:
        self.stopping.set()
        self.workers.stop()


def start_engine_ranks(sa: ServerArgs):
    """(server args with --dist-init-addr resolved, the rank watch or None at tp == 1) for an in-process rank 0."""
    if sa.tp_size == 1:
        return sa, None
    if sa.nnodes != 1:
        raise ValueError("sglang.Engine runs every TP rank on this machine; use --nnodes 1 (or the server).")
    check_tp_config(sa)
    sa = with_dist_init_addr(sa)
    return sa, InProcessRankWatch(start_node_workers(sa))
