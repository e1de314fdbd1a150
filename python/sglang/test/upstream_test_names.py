"""The model constants upstream's test files import from `sglang.test.test_utils`, pointed at what runs here offline.

Upstream names a Hugging Face repository per role (a small chat model, an embedding model, an MoE model, ...). This
project's tests run without downloading: the roles the bundled SmolLM2-135M-Instruct GGUF can fill resolve to its
path (a causal LM serves chat and completions, `--is-embedding` embeddings, `/v1/score` scoring). Roles it cannot fill
raise ImportError naming the role, what to set, and the fixture that builds a random-weight model of that kind.
Any name can be pointed elsewhere with an environment variable of the same name (a path or a hub id).
"""

from __future__ import annotations

import os

# roles the default model fills, with the flag a test adds for the role (documentation for the reader)
DEFAULT_MODEL_ROLES = {
    "DEFAULT_MODEL_NAME_FOR_TEST": "chat / completions",
    "DEFAULT_SMALL_MODEL_NAME_FOR_TEST": "chat / completions",
    "DEFAULT_SMALL_MODEL_NAME_FOR_TEST_BASE": "completions (the bundled model is instruction-tuned: no base model ships)",
    "DEFAULT_SMALL_EMBEDDING_MODEL_NAME_FOR_TEST": "embeddings with --is-embedding (last-token pooling)",
    "DEFAULT_SMALL_MODEL_NAME_FOR_TEST_SCORE": "POST /v1/score",
}
# roles nothing bundled fills -> (what the role is, how to get one here)
NO_OFFLINE_MODEL = {
    "DEFAULT_MOE_MODEL_NAME_FOR_TEST": ("a mixture-of-experts chat model", "sglang.test.moe_fixtures.make_random_mixtral"),
    "DEFAULT_SMALL_MOE_MODEL_NAME_FOR_TEST_BASE": ("a small MoE model", "sglang.test.moe_fixtures.make_random_qwen2_moe"),
    "DEFAULT_SMALL_MOE_MODEL_NAME_FOR_TEST_CHAT": ("a small MoE chat model", "sglang.test.moe_fixtures.make_random_qwen2_moe"),
    "DEFAULT_SMALL_VLM_MODEL_NAME_FOR_TEST": ("a vision-language model", "sglang.test.qwen_vl_fixtures.make_random_qwen2_5_vl"),
    "DEFAULT_SMALL_MODEL_NAME_FOR_TEST_QWEN": ("a Qwen2.5 chat model", "sglang.test.engine_fixtures.make_random_qwen3"),
    "DEFAULT_REASONING_MODEL_NAME_FOR_TEST": ("a reasoning (<think>) model", None),
    "DEFAULT_ENABLE_THINKING_MODEL_NAME_FOR_TEST": ("a model with a thinking switch", None),
    "DEFAULT_MLA_MODEL_NAME_FOR_TEST": ("a multi-head latent attention (DeepSeek-V2) model", None),
    "DEFAULT_MODEL_NAME_FOR_TEST_FP8": ("an fp8 checkpoint", None),
    "DEFAULT_MODEL_NAME_FOR_TEST_W8A8": ("a w8a8 checkpoint", None),
    "DEFAULT_SMALL_CROSS_ENCODER_MODEL_NAME_FOR_TEST": ("a cross-encoder (BERT-style) model", None),
}


def resolve(name: str) -> str:
    """The model path for an upstream constant, or ImportError saying why there is none."""
    if os.environ.get(name):
        return os.environ[name]
    if name in DEFAULT_MODEL_ROLES:
        from sglang.srt.model_loader.model_path import default_model_path

        try:
            return default_model_path()
        except FileNotFoundError as e:
            raise ImportError(f"sglang.test.test_utils.{name}: {e}") from None
    if name in NO_OFFLINE_MODEL:
        role, fixture = NO_OFFLINE_MODEL[name]
        how = f"build a random-weight one with {fixture}(path), or " if fixture else ""
        raise ImportError(f"sglang.test.test_utils.{name}: no {role} ships with this project for offline tests; "
                          f"{how}set the environment variable {name} to a model path.")
    raise AttributeError(name)
