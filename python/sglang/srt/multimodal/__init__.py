"""Multimodal inputs: image loading and preprocessing (main process), the embedding cache and encoder admission
(scheduler process), and the routine that splices image embeddings into the prompt embeddings (model forward).

    API image_data (data URL / base64 / bytes / local path / PIL)
      -> processors/*: load, resize, normalise, expand each image token into N pad tokens -> MultimodalInputs
      -> Scheduler: encoder_admission limits the images one prefill batch encodes (EncoderBudget)
      -> model forward: mm_utils.general_mm_embed_routine (embedding cache, then the encoder for the misses)
"""
