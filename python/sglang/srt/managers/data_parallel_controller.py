"""Data parallelism (`--dp-size N`): N independent replicas behind one HTTP server.

    main process                                          replica k (k = 0..N-1), its own scheduler process
      TokenizerManager -> DataParallelController
        PUSH --connect--> scheduler_input_<k>  <--bind-- PULL     requests routed to k; aborts to the owner;
                                                                  control messages (flush, info) to every replica
        PULL --bind----> tokenizer            <--connect-- PUSH   outputs of every replica (fan-in); RpcReply
                                                                  carries the replica's dp_rank

Each replica is a whole single-rank server core: its own model copy, KV pool, radix cache and memory plan. Memory
flags are per replica (--max-total-memory-gb X caps each replica at X, like a per-GPU cap); on CPU the replicas
share one RAM, so each plans from the available RAM / N (mem_plan/build.py: cpu_replica_share), and the default
--num-threads of a replica is cores / N. On GPUs replica k sees only the k-th visible device.

Upstream runs its dispatcher as a separate process; here it is a plain object in the main process (requests are
already tokenized there, so routing is one socket send, with no extra hop). Routing (--load-balance-method):
    round_robin     replica k, k+1, ... in turn
    shortest_queue  the replica with the fewest unfinished requests (as this dispatcher counts them)
    total_tokens    the replica with the fewest unfinished prompt + max_new_tokens tokens
Ties go to the lowest dp_rank. Both loads are counted here, at send and at the finishing output, so they are exact
and current (the replicas' stats pushes lag by up to half a second).

The N scheduler processes are started, watched and stopped by srt/launch/scheduler_processes.py.
"""

from __future__ import annotations

import logging
from typing import Dict, List

import zmq

from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
from sglang.srt.managers.port_args import PortArgs
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

# server_info keys that describe one replica (its plan and state); the others are the same on every replica
PER_REPLICA_INFO_KEYS = ("max_total_num_tokens", "max_running_requests", "max_req_len", "max_req_input_len",
                         "memory_plan", "memory_plan_per_rank", "cuda_graphs", "stats", "memory_integrity",
                         "internal_states")


def replica_port_args(port_args: PortArgs, dp_size: int) -> List[PortArgs]:
    return [port_args] if dp_size == 1 else [port_args.for_replica(k) for k in range(dp_size)]


# ====================================================================== dispatching (main process)
class DataParallelController:
    """Routes requests to replicas and keeps, per replica, the unfinished requests it was given."""

    def __init__(self, context: zmq.Context, port_args: PortArgs, server_args: ServerArgs):
        self.method = server_args.load_balance_method
        self.sockets = []
        for pa in replica_port_args(port_args, server_args.dp_size):
            sock = context.socket(zmq.PUSH)
            sock.connect(pa.scheduler_input_ipc_name)
            self.sockets.append(sock)
        self.next_rank = 0
        self.rid_to_rank: Dict[str, int] = {}
        self.rid_to_tokens: Dict[str, int] = {}
        self.num_requests = [0] * self.num_replicas  # unfinished requests per replica
        self.num_tokens = [0] * self.num_replicas  # their prompt + max_new_tokens
        self.num_dispatched = [0] * self.num_replicas  # requests sent since startup

    @property
    def num_replicas(self) -> int:
        return len(self.sockets)

    def pick(self, req: TokenizedGenerateReqInput) -> int:
        if self.method == "round_robin":
            rank = self.next_rank
            self.next_rank = (rank + 1) % self.num_replicas
            return rank
        load = self.num_requests if self.method == "shortest_queue" else self.num_tokens
        return min(range(self.num_replicas), key=lambda k: (load[k], k))

    def send_request(self, req: TokenizedGenerateReqInput) -> int:
        rank = self.pick(req)
        tokens = len(req.input_ids) + (req.sampling_params.max_new_tokens or 0)
        self.rid_to_rank[req.rid] = rank
        self.rid_to_tokens[req.rid] = tokens
        self.num_requests[rank] += 1
        self.num_tokens[rank] += tokens
        self.num_dispatched[rank] += 1
        self.sockets[rank].send_pyobj(req)
        return rank

    def on_finished(self, rid: str) -> None:
        """A request's last output arrived (finished, aborted or refused): it no longer loads its replica."""
        rank = self.rid_to_rank.pop(rid, None)
        if rank is not None:
            self.num_requests[rank] -= 1
            self.num_tokens[rank] -= self.rid_to_tokens.pop(rid, 0)

    def abort(self, rid: str) -> None:
        rank = self.rid_to_rank.get(rid)
        if rank is not None:
            self.sockets[rank].send_pyobj(AbortReq(rid))

    def broadcast(self, msg) -> None:
        for sock in self.sockets:
            sock.send_pyobj(msg)

    def loads(self) -> List[dict]:
        return [{"dp_rank": k, "num_dispatched_requests": self.num_dispatched[k],
                 "num_unfinished_requests": self.num_requests[k], "num_unfinished_tokens": self.num_tokens[k]}
                for k in range(self.num_replicas)]


# ====================================================================== merging replica answers
def merge_ready_info(infos: List[dict]) -> dict:
    """What the main process serves with: replica 0's facts, with the request limits every replica accepts."""
    merged = dict(infos[0])
    for key in ("max_req_len", "max_req_input_len", "context_len"):
        values = [i[key] for i in infos if i.get(key) is not None]
        if values:
            merged[key] = min(values)
    return merged


def merge_server_info(infos: List[dict], dispatcher: DataParallelController) -> dict:
    """/server_info of N replicas: the shared facts once; internal_states one entry per replica (upstream's shape);
    `replicas` one object per replica with its own memory plan, limits and integrity; memory_integrity "ok" only
    when every replica's is."""
    if len(infos) == 1:
        return infos[0]
    shared = merge_ready_info(infos)
    merged = {k: v for k, v in shared.items() if k not in PER_REPLICA_INFO_KEYS}
    for key in ("max_req_len", "max_req_input_len"):  # the limits every replica accepts
        if key in shared:
            merged[key] = shared[key]
    merged["internal_states"] = [state for i in infos for state in i.get("internal_states", [])]
    merged["replicas"] = [{"dp_rank": k, **{key: i.get(key) for key in PER_REPLICA_INFO_KEYS if key in i}}
                          for k, i in enumerate(infos)]
    for entry, load in zip(merged["replicas"], dispatcher.loads()):
        entry["dispatcher"] = load
    bad = [f"replica {k}: {i.get('memory_integrity')}" for k, i in enumerate(infos)
           if i.get("memory_integrity", "ok") != "ok"]
    merged["memory_integrity"] = "; ".join(bad) if bad else "ok"
    merged["max_total_num_tokens"] = sum(i.get("max_total_num_tokens") or 0 for i in infos)
    return merged


def aggregate_stats(per_replica: Dict[int, dict]) -> dict:
    """Server-wide live stats from each replica's last push: counts add up; token_usage is the used share of all
    KV pools together (each replica's usage weighted by its pool size)."""
    stats = list(per_replica.values())
    if len(stats) == 1:
        return stats[0]
    out: dict = {}
    for s in stats:
        for key, value in s.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "token_usage":
                out[key] = out.get(key, 0) + value
            elif isinstance(value, list):  # cumulative histogram buckets (e.g. grammar compile times) add up
                prev = out.get(key) or [0] * len(value)
                out[key] = [a + b for a, b in zip(prev, value)]
    pool = [s.get("max_total_num_tokens") or 0 for s in stats]
    if sum(pool):
        out["token_usage"] = sum(s.get("token_usage", 0.0) * p for s, p in zip(stats, pool)) / sum(pool)
    else:
        out["token_usage"] = sum(s.get("token_usage", 0.0) for s in stats) / len(stats)
    return out
