"""Model loading: --model-path -> local HF directory -> nn.Module with weights.

    model_dir = resolve_model_path(server_args)
    model_config = ModelConfig.from_server_args(server_args, model_dir)
    model = load_model(model_config)
"""

from sglang.srt.model_loader.model_path import resolve_model_path, resolve_tokenizer_path


def load_model(model_config, device=None, quantization="none", gguf_path=None, packed_vocab=None):
    from sglang.srt.model_loader.loader import load_model as _load_model

    return _load_model(model_config, device, quantization, gguf_path, packed_vocab)


__all__ = ["resolve_model_path", "resolve_tokenizer_path", "load_model"]
