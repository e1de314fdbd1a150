"""The data-parallel dispatcher without a model: routing rules, abort/broadcast targets, merged /server_info and stats,
the flags' refusals, and `sglang plan --dp-size` (memory flags are per replica; on CPU each replica plans from
available RAM / N). Real sockets: each fake replica is a bound PULL socket, so what it received is what was routed."""

import zmq

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="cpu")

import pytest  # noqa: E402

from sglang.srt.managers.data_parallel_controller import (  # noqa: E402
    DataParallelController,
    aggregate_stats,
    merge_server_info,
)
from sglang.srt.managers.io_struct import AbortReq, FlushCacheReq, TokenizedGenerateReqInput  # noqa: E402
from sglang.srt.managers.port_args import PortArgs  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.srt.mem_plan.units import GiB  # noqa: E402


@pytest.fixture
def replicas(tmp_path):
    """(make_controller(method), receive(k) -> messages replica k got so far)."""
    ctx = zmq.Context()
    # linger 0 for every socket of the test, the dispatcher's PUSH sockets included: a controller dropped with
    # messages not yet handed over (sent, never received, the connection still being made) would otherwise keep
    # ctx.destroy() below waiting for ever (it closes only the sockets still open)
    ctx.setsockopt(zmq.LINGER, 0)
    port_args = PortArgs.init_new(str(tmp_path))
    pulls = []
    for k in range(3):
        sock = ctx.socket(zmq.PULL)
        sock.bind(port_args.for_replica(k).scheduler_input_ipc_name)
        pulls.append(sock)

    def make(method):
        return DataParallelController(ctx, port_args, ServerArgs(dp_size=3, load_balance_method=method))

    def receive(k):
        out = []
        while pulls[k].poll(200):
            out.append(pulls[k].recv_pyobj())
        return out

    yield make, receive
    ctx.destroy(linger=0)


def req(rid, prompt_len=4, max_new_tokens=8):
    return TokenizedGenerateReqInput(rid=rid, input_text=None, input_ids=[1] * prompt_len,
                                     sampling_params=SamplingParams.from_dict({"max_new_tokens": max_new_tokens}))


def test_round_robin_cycles_and_each_replica_receives_its_requests(replicas):
    make, receive = replicas
    dp = make("round_robin")
    assert [dp.send_request(req(f"r{i}")) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [m.rid for m in receive(0)] == ["r0", "r3", "r6"]
    assert [m.rid for m in receive(1)] == ["r1", "r4"]
    assert [m.rid for m in receive(2)] == ["r2", "r5"]


def test_shortest_queue_counts_unfinished_requests(replicas):
    make, _ = replicas
    dp = make("shortest_queue")
    assert [dp.send_request(req(f"r{i}")) for i in range(4)] == [0, 1, 2, 0]  # ties go to the lowest rank
    dp.on_finished("r1")
    dp.on_finished("r2")
    assert dp.send_request(req("a")) == 1  # replica 0 holds 2, replicas 1 and 2 hold 0
    dp.on_finished("r1")  # a second finish of the same request changes nothing
    assert [x["num_unfinished_requests"] for x in dp.loads()] == [2, 1, 0]
    assert dp.send_request(req("b")) == 2


def test_total_tokens_counts_prompt_plus_max_new_tokens(replicas):
    make, _ = replicas
    dp = make("total_tokens")
    assert dp.send_request(req("big", prompt_len=90, max_new_tokens=10)) == 0  # 100 tokens
    assert dp.send_request(req("s1", max_new_tokens=16)) == 1  # 20
    assert dp.send_request(req("s2", max_new_tokens=16)) == 2  # 20
    assert dp.send_request(req("s3", max_new_tokens=16)) == 1  # 40 < 100
    assert [x["num_unfinished_tokens"] for x in dp.loads()] == [100, 40, 20]
    dp.on_finished("big")
    assert dp.send_request(req("s4")) == 0
    assert [x["num_dispatched_requests"] for x in dp.loads()] == [2, 2, 1]


def test_abort_goes_to_the_owner_and_control_messages_to_every_replica(replicas):
    make, receive = replicas
    dp = make("round_robin")
    dp.send_request(req("x"))  # replica 0
    dp.send_request(req("y"))  # replica 1
    for k in range(3):
        receive(k)
    dp.abort("y")
    dp.abort("unknown")  # finished or never sent: nothing to abort
    dp.broadcast(FlushCacheReq())
    got = [receive(k) for k in range(3)]
    assert [type(m) for m in got[0]] == [FlushCacheReq]
    assert [type(m) for m in got[1]] == [AbortReq, FlushCacheReq] and got[1][0].rid == "y"
    assert [type(m) for m in got[2]] == [FlushCacheReq]


def test_merged_server_info_keeps_each_replica_plan(replicas):
    make, _ = replicas
    dp = make("round_robin")
    infos = [{"context_len": 8192, "max_req_len": 8192 - k, "max_total_num_tokens": 1000 + k,
              "memory_plan": {"budget_bytes": k}, "memory_integrity": "ok" if k != 2 else "violated: x",
              "internal_states": [{"num_used_tokens": k}]} for k in range(3)]
    merged = merge_server_info(infos, dp)
    assert [r["memory_plan"]["budget_bytes"] for r in merged["replicas"]] == [0, 1, 2]
    assert merged["internal_states"] == [{"num_used_tokens": k} for k in range(3)]
    assert merged["max_req_len"] == 8190  # what every replica accepts
    assert merged["max_total_num_tokens"] == 3003
    assert merged["memory_integrity"] == "replica 2: violated: x"
    assert merge_server_info(infos[:1], dp) is infos[0]


def test_aggregate_stats_adds_counts_and_weights_token_usage():
    stats = {0: {"num_running_reqs": 2, "token_usage": 0.5, "max_total_num_tokens": 100},
             1: {"num_running_reqs": 1, "token_usage": 0.0, "max_total_num_tokens": 300}}
    agg = aggregate_stats(stats)
    assert agg["num_running_reqs"] == 3 and agg["token_usage"] == pytest.approx(50 / 400)


def test_refusals_name_the_flags():
    with pytest.raises(ValueError, match="--dp-size 2 with --tp-size 2"):
        ServerArgs(dp_size=2, tp_size=2)
    with pytest.raises(ValueError, match="--load-balance-method=.random. is not allowed"):
        ServerArgs(dp_size=2, load_balance_method="random")
    with pytest.raises(ValueError, match="--dp-size must be a positive"):
        ServerArgs(dp_size=0)
    import sglang

    with pytest.raises(ValueError, match="sglang serve --dp-size"):
        sglang.Engine(dp_size=2)


@pytest.mark.parametrize("flags, per_replica_gib", [
    ([], 8 / 2 * 0.5),  # the CPU default share (half of what is available) of each replica's half of the RAM
    # a cap is per replica; --num-threads pinned, as each kernel thread's extend scratch is planned (one replica of
    # two on this machine's cores would otherwise get fewer threads, and 16 B per context token less of it)
    (["--max-total-memory-gb", "1", "--num-threads", "1"], 1.0),
])
def test_plan_is_per_replica(flags, per_replica_gib):
    from sglang.cli.plan import run

    status, one, _ = run(["--device", "cpu", "--total-memory-gb", "8", *flags, "--json"])
    status2, two, text = run(["--device", "cpu", "--total-memory-gb", "8", "--dp-size", "2", *flags, "--json"])
    assert status == status2 == 0, text
    assert two["plan"]["budget_bytes"] == int(per_replica_gib * GiB)
    if flags:  # the same cap with or without replicas
        assert two["plan"]["max_total_num_tokens"] == one["plan"]["max_total_num_tokens"]
    assert two["dp_size"] == 2 and "x dp=2" in text
