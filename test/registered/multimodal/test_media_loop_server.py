"""Media decoding never holds the HTTP event loop, and a burst's memory goes back (issue 45 item 4), through the
HTTP server of a small random Qwen3-Omni Thinker (images, a 64-frame video, audio):

- /health, polled every 50 ms from a separate process (so the client's own GIL is not what is measured), answers
  within MAX_HEALTH_S while one 8000x8000 MJPEG frame decodes, and within STORM_MAX_HEALTH_S (see there) during
  a storm of 200 streams closed by their client after the first chunk (the lag is printed); a frame whose stream
  header is over the decoder's pixel limit is a 400 naming the limit, answered before any decoding (far faster than
  decoding the accepted frame).
- The HTTP process's RSS is back within 10% of its start (after one warm-up request: imports and caches are not
  the burst's) 10 s after a burst of BURST concurrent requests at the multimodal limits (4 images of 1024x768, a
  64-frame video, 2 audios of 4 s). BURST is 24, not the issue's 50 (50 take minutes on 2 cores); without
  memory_release's trim the RSS stays ~40% up (383 -> 1,093 -> 552 MB), with it ~5% (337 -> 1,017 -> 358 MB).
"""

import asyncio
import base64
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import requests

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="cpu", serial=True)  # asserts a time or CPU measure: run alone

from sglang.srt.multimodal.image_loader import MAX_DECODED_IMAGE_PIXELS  # noqa: E402
from sglang.test.audio_fixtures import audio_file, b64  # noqa: E402
from sglang.test.mm_fixtures import data_url, make_image  # noqa: E402
from sglang.test.qwen3_omni_fixtures import make_random_qwen3_omni_thinker, make_waveform  # noqa: E402
from sglang.test.qwen_vl_fixtures import make_video, video_data_url  # noqa: E402
from sglang.test.test_utils import popen_launch_server  # noqa: E402

MAX_HEALTH_S = 0.1
# The storm's cause was the loop's own work per request piling up in single iterations: uvicorn parsed the 200
# requests that arrived together in one iteration (h11, 70-160 ms), and their first steps (ASGI stack, body parsing
# and validation, ~1-2 ms each while pool threads hold the GIL) ran back to back in the next. Now received bytes are
# parsed 8 chunks an iteration (entrypoints/read_pacing.py), requests prepare a few at a time
# (managers/request_admission.py) and pool jobs come back one per thread an iteration (offloop_executor.py).
# Measured on this 2-core Xeon (3 runs each, same load): max 12-14 ms (median 4-7) where the old code took 88-170 ms
# (median 9-20); 12-65 ms while other work loads the machine (load average 4-6). The 0.1 s holds here with
# margin; the bound leaves room for a CI machine up to 2x slower under the same load (~130 ms).
STORM_MAX_HEALTH_S = 0.15
POLL_INTERVAL_S = 0.05
BURST = 24
RSS_TOLERANCE = 0.10
SETTLE_S = 10

# polls GET <url>/health every 50 ms until its stdin closes, then prints the latencies (s) as JSON
POLLER = """
import json, select, sys, time, urllib.request
url, lags = sys.argv[1] + "/health", []
urllib.request.urlopen(url, timeout=30).read()
print("ready", flush=True)
while not select.select([sys.stdin], [], [], %r)[0]:
    t = time.perf_counter()
    urllib.request.urlopen(url, timeout=30).read()
    lags.append(time.perf_counter() - t)
print(json.dumps(lags), flush=True)
""" % POLL_INTERVAL_S


def mjpeg_avi(side: int) -> bytes:
    """One side x side MJPEG frame in an AVI (blocky noise, so the JPEG is a few MB)."""
    import av
    import numpy as np

    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    with av.open(buf, "w", format="avi") as c:
        s = c.add_stream("mjpeg", rate=1)
        s.width, s.height, s.pix_fmt = side, side, "yuvj420p"
        block = rng.integers(0, 256, (-(-side // 8), -(-side // 8), 3), dtype=np.uint8)
        frame = block.repeat(8, 0).repeat(8, 1)[:side, :side]
        for p in s.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")):
            c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


def mjpeg_avi_growing(small: int, big: int) -> bytes:
    """An MJPEG AVI whose stream header (and first frame) is small x small and whose second frame is big x big:
    only that frame's own JPEG header tells its size."""
    from fractions import Fraction

    import av
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format="avi") as c:
        s = c.add_stream("mjpeg", rate=1)
        s.width, s.height, s.pix_fmt = small, small, "yuvj420p"
        packets = list(s.encode(av.VideoFrame.from_ndarray(np.zeros((small, small, 3), np.uint8), format="rgb24")))
        packets += list(s.encode())
        enc = av.CodecContext.create("mjpeg", "w")
        enc.width, enc.height, enc.pix_fmt, enc.time_base = big, big, "yuvj420p", Fraction(1, 1)
        frame = av.VideoFrame.from_ndarray(np.zeros((big, big, 3), np.uint8), format="rgb24")
        for i, p in enumerate(list(enc.encode(frame)) + list(enc.encode())):
            p.stream, p.pts, p.dts = s, 1 + i, 1 + i
            packets.append(p)
        for p in packets:
            c.mux(p)
    return buf.getvalue()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


class TestMediaLoopServer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        model = make_random_qwen3_omni_thinker(os.path.join(cls.tmp.name, "model"), video_max_frames=64)
        cls.server = popen_launch_server(
            model,
            other_args=["--max-total-tokens", "16384", "--max-running-requests", "16", "--context-length", "4096",
                        "--max-audio-seconds", "4", "--max-video-frames", "64",
                        "--limit-mm-data-per-request", '{"image": 4, "video": 1, "audio": 2}', "--random-seed", "0"])
        cls.url = cls.server.base_url

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.tmp.cleanup()

    def chat(self, parts, max_tokens=2):
        return requests.post(f"{self.url}/v1/chat/completions", timeout=600, json={
            "model": "m", "messages": [{"role": "user", "content": parts}], "max_tokens": max_tokens})

    def health_during(self, fn):
        """(fn's result, sorted /health latencies polled while fn ran)."""
        poller = subprocess.Popen([sys.executable, "-c", POLLER, self.url], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        self.assertEqual(poller.stdout.readline().strip(), "ready")
        time.sleep(2 * POLL_INTERVAL_S)
        try:
            result = fn()
        finally:
            poller.stdin.close()
            lags = json.loads(poller.stdout.readline())
            poller.wait(30)
        return result, sorted(lags)

    def test_health_fast_while_an_8000x8000_frame_decodes(self):
        clip = mjpeg_avi(8000)
        part = {"type": "video_url", "video_url": {"url": "data:video/avi;base64," + base64.b64encode(clip).decode()}}
        t0 = time.perf_counter()
        r, lags = self.health_during(lambda: self.chat([part, {"type": "text", "text": "what is it?"}]))
        decode_s = time.perf_counter() - t0
        self.assertEqual(r.status_code, 200, r.text)
        self.assertGreaterEqual(len(lags), 5, f"the request took {decode_s:.2f} s")
        self.assertLess(lags[-1], MAX_HEALTH_S, lags)
        # over the decoder's limit by its stream header: refused before any pixel is decoded
        side = int(MAX_DECODED_IMAGE_PIXELS ** 0.5) + 8
        big = "data:video/avi;base64," + base64.b64encode(mjpeg_avi(side)).decode()
        t0 = time.perf_counter()
        r = self.chat([{"type": "video_url", "video_url": {"url": big}}, {"type": "text", "text": "x"}])
        refuse_s = time.perf_counter() - t0
        self.assertEqual(r.status_code, 400, r.text)
        err = r.json()["error"]
        self.assertEqual(err["param"], "messages")
        self.assertIn(f"{side}x{side}", err["message"])
        self.assertIn(f"at most {MAX_DECODED_IMAGE_PIXELS:,} pixels per frame", err["message"])
        self.assertIn("stream header", err["message"])
        self.assertLess(refuse_s, decode_s / 3)
        # a later frame over the limit, by its own JPEG header while demuxing (the stream header says 64x64)
        grown = "data:video/avi;base64," + base64.b64encode(mjpeg_avi_growing(64, side)).decode()
        r = self.chat([{"type": "video_url", "video_url": {"url": grown}}, {"type": "text", "text": "x"}])
        self.assertEqual(r.status_code, 400, r.text)
        self.assertIn(f"{side}x{side} = {side * side:,} pixels (the JPEG header of frame 1)",
                      r.json()["error"]["message"])

    def test_health_fast_during_a_200_stream_disconnect_storm(self):
        import aiohttp

        img = {"type": "image_url", "image_url": {"url": data_url(make_image(0, 64, 64))}}
        body = {"model": "m", "messages": [{"role": "user", "content": [img, {"type": "text", "text": "hi"}]}],
                "max_tokens": 200, "stream": True, "ignore_eos": True}
        first_chunks = []

        async def one(session):
            async with session.post(f"{self.url}/v1/chat/completions", json=body) as r:
                first_chunks.append(await r.content.readline())  # then the connection closes mid-stream

        async def storm():
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                await asyncio.gather(*(one(session) for _ in range(200)))

        _, lags = self.health_during(lambda: asyncio.run(storm()))
        self.assertEqual(len(first_chunks), 200)
        self.assertTrue(all(c.startswith(b"data: ") for c in first_chunks), first_chunks[:3])
        self.assertGreaterEqual(len(lags), 5)
        print(f"/health during the storm: max {lags[-1] * 1000:.0f} ms, median {lags[len(lags) // 2] * 1000:.0f} ms")
        self.assertLess(lags[-1], STORM_MAX_HEALTH_S, lags)
        self.assertEqual(self.chat([img, {"type": "text", "text": "after"}]).status_code, 200)

    def test_rss_returns_after_a_burst_at_the_limits(self):
        images = [{"type": "image_url", "image_url": {"url": data_url(make_image(i, 1024, 768))}} for i in range(4)]
        video = {"type": "video_url", "video_url": {
            "url": video_data_url(make_video(1, num_frames=64, width=320, height=240, fps=2))}}
        audios = [{"type": "input_audio", "input_audio": {
            "data": b64(audio_file(make_waveform(i, 4.0), subtype="PCM_16")), "format": "wav"}} for i in range(2)]
        parts = images + [video] + audios + [{"type": "text", "text": "all of it"}]
        self.assertEqual(self.chat(parts).status_code, 200)  # warm-up: imports, caches, pool threads
        time.sleep(2)
        pid = self.server.pid
        start = rss_mb(pid)
        codes, peak = [], [start]

        def sample():
            while len(codes) < BURST:
                peak.append(rss_mb(pid))
                time.sleep(0.2)

        threads = [threading.Thread(target=lambda: codes.append(self.chat(parts).status_code)) for _ in range(BURST)]
        sampler = threading.Thread(target=sample)
        sampler.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sampler.join()
        self.assertEqual(codes, [200] * BURST)
        time.sleep(SETTLE_S)
        after = rss_mb(pid)
        print(f"HTTP process RSS: start {start:.0f} MB, peak {max(peak):.0f} MB, {SETTLE_S} s after {after:.0f} MB")
        self.assertLess(after, start * (1 + RSS_TOLERANCE), (start, max(peak), after))


if __name__ == "__main__":
    unittest.main()
