"""A burst's work on the event loop is spread over loop iterations instead of piling up in one: received bytes are
parsed a few chunks per iteration (entrypoints/read_pacing.py), requests are admitted to their preparation a few at a
time (managers/request_admission.py) and pool jobs wait for a free thread on the loop (offloop_executor.py); /health
and /metrics are never held. The effect on /health during a 200-stream storm is
measured through the server in test/registered/multimodal/test_media_loop_server.py."""

import asyncio
import threading
import time

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu", serial=True)  # asserts a time or CPU measure: run alone

from sglang.srt.entrypoints.http_middleware import AdmissionMiddleware  # noqa: E402
from sglang.srt.entrypoints.read_pacing import ReadPacer  # noqa: E402
from sglang.srt.managers.offloop_executor import OffLoopExecutor  # noqa: E402
from sglang.srt.managers.request_admission import RequestAdmission, release_admission  # noqa: E402

LIMIT = 3
NUM_REQUESTS = 12


class FakeServer:
    """An ASGI app whose requests prepare (a few loop steps), send their generation from a child task (as
    generate_many's pumps do), then generate for a while and answer; it counts how many do each at once."""

    def __init__(self, fail_every: int = 0):
        self.preparing = self.generating = 0
        self.max_preparing = self.max_generating = 0
        self.fail_every = fail_every
        self.num_calls = 0

    async def __call__(self, scope, receive, send):
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            return await send({"type": "http.response.body", "body": b"ok"})
        self.num_calls += 1
        if self.fail_every and self.num_calls % self.fail_every == 0:
            raise RuntimeError("a handler that fails still gives its place back")
        self.preparing += 1
        self.max_preparing = max(self.max_preparing, self.preparing)
        for _ in range(3):
            await asyncio.sleep(0.002)
        self.preparing -= 1

        async def pump():
            release_admission()  # the generation request went to the scheduler
            self.generating += 1
            self.max_generating = max(self.max_generating, self.generating)
            await asyncio.sleep(0.05)
            self.generating -= 1

        await asyncio.ensure_future(pump())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})


async def request(app, path):
    statuses = []

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    try:
        await app({"type": "http", "method": "GET", "path": path, "headers": []}, receive, send)
    except RuntimeError:
        statuses.append(500)
    return statuses[0]


def test_a_few_prepare_at_once_all_generate_together_and_health_never_waits():
    server = FakeServer()
    admission = None

    async def go():
        nonlocal admission
        admission = RequestAdmission(LIMIT)
        app = AdmissionMiddleware(server, admission)
        burst = [asyncio.ensure_future(request(app, "/v1/chat/completions")) for _ in range(NUM_REQUESTS)]
        await asyncio.sleep(0.003)  # the gate is full and requests wait behind it
        t0 = time.perf_counter()
        probe = await request(app, "/health")
        probe_s = time.perf_counter() - t0
        return await asyncio.gather(*burst), probe, probe_s

    statuses, probe, probe_s = asyncio.run(go())
    assert statuses == [200] * NUM_REQUESTS and probe == 200
    assert server.max_preparing == LIMIT, server.max_preparing  # bounded, and the bound is used
    # a request leaves the gate when its generation is sent, not when it ends: generations overlap beyond LIMIT
    assert server.max_generating > LIMIT, server.max_generating
    assert probe_s < 0.002, probe_s
    assert admission.num_admitted_total == NUM_REQUESTS and admission.gate._value == LIMIT


def test_a_handler_that_fails_or_answers_before_generating_gives_its_place_back():
    server = FakeServer(fail_every=2)

    async def go():
        admission = RequestAdmission(1)
        app = AdmissionMiddleware(server, admission)
        statuses = await asyncio.wait_for(
            asyncio.gather(*(request(app, "/v1/completions") for _ in range(6))), timeout=10)
        return statuses, admission.gate._value

    statuses, free = asyncio.run(go())
    assert sorted(statuses) == [200] * 3 + [500] * 3 and free == 1


def test_pool_jobs_wait_on_the_loop_for_a_free_thread():
    """Never more jobs handed to the pool than it has threads: the rest wait on the loop, so their continuations
    come back at most num_threads per iteration."""
    executor = OffLoopExecutor(num_threads=2)
    running, most, lock = [0], [0], threading.Lock()

    def job():
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0] + executor.pool._work_queue.qsize())
        time.sleep(0.01)
        with lock:
            running[0] -= 1

    async def go():
        await asyncio.gather(*(executor.run(job) for _ in range(10)))

    try:
        asyncio.run(go())
    finally:
        executor.shutdown()
    assert most[0] == 2, most[0]


class FakeTransport:
    def __init__(self):
        self.reading, self.closing = True, False

    def is_reading(self):
        return self.reading

    def pause_reading(self):
        self.reading = False

    def resume_reading(self):
        self.reading = True

    def is_closing(self):
        return self.closing


class FakeConnection:
    """What the pacer needs of uvicorn's protocol (server_lifecycle.http_protocol_class); records what it parsed in
    which loop iteration."""

    paced_pending = 0
    paced_paused = False

    def __init__(self, name, parsed, iteration):
        self.name, self.parsed, self.iteration = name, parsed, iteration
        self.transport = FakeTransport()
        self.flow = None

    def data_received(self, pacer, data):
        if pacer.offer(self, data):
            self.parse_now(data)

    def parse_now(self, data):
        self.parsed.append((self.iteration[0], self.name, data))


def test_a_burst_of_reads_is_parsed_a_few_per_iteration_and_probes_at_once():
    parsed, iteration = [], [0]
    conns = [FakeConnection(i, parsed, iteration) for i in range(20)]

    async def go():
        pacer = ReadPacer(per_iteration=4)
        loop = asyncio.get_running_loop()
        stop = loop.create_future()

        def count_iterations():  # call_soon from a callback: once per loop iteration
            iteration[0] += 1
            if iteration[0] < 10:
                loop.call_soon(count_iterations)
            else:
                stop.set_result(None)

        def burst():  # every socket readable in one iteration, as 20 requests arriving together
            loop.call_soon(count_iterations)
            for c in conns:
                c.data_received(pacer, b"POST /v1/chat/completions HTTP/1.1\r\n")
            conns[3].data_received(pacer, b"body of 3")  # behind its own first chunk
            conns[4].data_received(pacer, b"GET /health HTTP/1.1\r\n\r\n")  # pipelined: a probe, still in order
            conns[5].transport.closing = True  # this client left before its turn
            probe = FakeConnection("probe", parsed, iteration)
            probe.data_received(pacer, b"GET /health HTTP/1.1\r\n\r\n")

        loop.call_soon(burst)
        await stop
        return pacer

    pacer = asyncio.run(go())
    per_iteration = {}
    for it, _, _ in parsed:
        per_iteration[it] = per_iteration.get(it, 0) + 1
    assert per_iteration[0] == 4 + 1, per_iteration  # 4 paced + the probe, in the burst's own iteration
    assert ("probe" in [n for it, n, _ in parsed if it == 0])
    assert max(per_iteration.values()) <= 5 and all(n <= 4 for it, n in per_iteration.items() if it > 0)
    names = [n for _, n, _ in parsed if n != "probe"]
    assert 5 not in names and sorted(names, key=str) == sorted([i for i in range(20) if i != 5] + [3, 4], key=str)
    assert names[:4] == [0, 1, 2, 3]  # arrival order
    first_of_3 = [d for _, n, d in parsed if n == 3]
    assert first_of_3[1] == b"body of 3"  # a connection's chunks keep their order
    assert [d for _, n, d in parsed if n == 4][1].startswith(b"GET /health")
    assert pacer.num_deferred == 20 - 4 + 2
    assert all(c.transport.reading and c.paced_pending == 0 for c in conns if c.name != 5)
