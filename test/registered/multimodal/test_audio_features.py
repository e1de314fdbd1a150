"""Audio inputs without a model: our log-mel features vs HF transformers' WhisperFeatureExtractor (its numpy path;
the mel filterbank to 1e-12, the features to 1e-5) at 128 and 80 mel bins; the <|AUDIO|> token count vs HF's
formula; and the loader: wav / flac / ogg / mp3 decoding, stereo mix-down, soxr resampling (a 440 Hz tone stays at
440 Hz), OpenAI's input_audio object, and ValueErrors (the server's 400s) for corrupt bytes, bad base64, an unknown
format, remote URLs, paths outside the allowed directory, and clips longer than the limit (naming it and the
clip's duration, checked from the header before decoding)."""

import os
import tempfile
import unittest

import numpy as np

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=8, suite="cpu")

from sglang.srt.multimodal.audio_features import (  # noqa: E402
    MelConfig,
    log_mel,
    mel_filterbank,
    whisper_output_tokens,
)
from sglang.srt.multimodal.audio_loader import load_audio  # noqa: E402
from sglang.test.audio_fixtures import audio_data_url, audio_file, b64, hf_features, tone  # noqa: E402

WINDOW = 480000


def dominant_hz(x: np.ndarray, rate: int) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.fft.rfftfreq(x.size, 1 / rate)[spec.argmax()])


class TestLogMel(unittest.TestCase):
    def test_against_whisper_feature_extractor(self):
        from transformers import WhisperFeatureExtractor

        for bins in (128, 80):
            fe = WhisperFeatureExtractor(feature_size=bins)
            cfg = MelConfig(num_mel_bins=bins)
            np.testing.assert_allclose(mel_filterbank(cfg).numpy(), fe.mel_filters, rtol=0, atol=1e-12)
            for seconds, seed in ((3.0047, 0), (0.37, 1), (30.0, 2)):
                x = tone(seconds, seed=seed)
                ref = fe._np_extract_fbank_features(np.pad(x, (0, WINDOW - x.size))[None], "cpu")[0]
                ours = log_mel(x, cfg, pad_to_samples=WINDOW).numpy()
                self.assertEqual(ours.shape, (bins, 3000))
                np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-5)

    def test_token_count_matches_hf(self):
        clips = [tone(s, seed=i) for i, s in enumerate((0.05, 1.0, 2.5001, 29.99, 30.0))]
        _, mask, tokens = hf_features(clips)
        cfg = MelConfig()
        self.assertEqual([cfg.num_frames(c.size) for c in clips], mask.sum(-1).tolist())
        self.assertEqual([whisper_output_tokens(cfg.num_frames(c.size)) for c in clips], tokens)
        self.assertEqual(tokens[-1], 750)


class TestAudioLoader(unittest.TestCase):
    def test_formats_mixdown_and_resampling(self):
        x = 0.5 * np.sin(2 * np.pi * 440 * np.arange(44100) / 44100).astype(np.float32)
        stereo = np.stack([x, x], axis=1)
        for fmt, subtype in (("WAV", "PCM_16"), ("FLAC", "PCM_16"), ("OGG", "VORBIS"), ("MP3", "MPEG_LAYER_III")):
            data = audio_file(stereo, rate=44100, fmt=fmt, subtype=subtype)
            y = load_audio(audio_data_url(data), None, 16000, 600)
            self.assertEqual(y.ndim, 1)
            self.assertAlmostEqual(y.size / 16000, 1.0, delta=0.06, msg=fmt)
            self.assertAlmostEqual(dominant_hz(y, 16000), 440, delta=3, msg=fmt)
        y = load_audio({"data": b64(audio_file(x, rate=44100)), "format": "wav"}, None, 16000, 600)
        self.assertEqual(y.size, 16000)

    def test_errors_name_the_problem(self):
        wav = audio_file(tone(3.0))
        cases = [
            (audio_data_url(b"RIFF\x00\x00not really a wav" * 20), "could not be decoded as audio"),
            ("data:audio/wav;base64,@@@", "not valid base64"),
            ("data:image/png;base64," + b64(wav), "audio/"),
            ({"data": b64(wav), "format": "midi"}, "input_audio.format 'midi'"),
            ("https://example.com/a.wav", "Remote audio URLs are not fetched"),
            ("/etc/passwd", "Local audio paths are not allowed"),
            (audio_data_url(wav), "The audio is 3.00 s long; this server accepts at most 2 s per audio "
                                  "(--max-audio-seconds)"),
        ]
        for item, message in cases:
            with self.assertRaises(ValueError) as ctx:
                load_audio(item, None, 16000, 2.0)
            self.assertIn(message, str(ctx.exception))

    def test_local_file_under_allowed_dir(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "a.flac")
            with open(path, "wb") as f:
                f.write(audio_file(tone(1.0), fmt="FLAC", subtype="PCM_16"))
            self.assertEqual(load_audio("file://" + path, d, 16000, 600).size, 16000)
            with self.assertRaises(ValueError):
                load_audio(path, os.path.join(d, "sub"), 16000, 600)


if __name__ == "__main__":
    unittest.main()
