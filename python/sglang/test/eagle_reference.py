"""A plain-torch reference of EAGLE-3 and EAGLE-1 heads (tests): the head's rows over a whole sequence with full causal
attention (no paged KV, no caches), from the head checkpoint's tensors and the target's features computed by HF
transformers -- independent of the runtime's capture, draft pool and proposer.

proposals(seq, p, k): the head's k greedy proposals for a request whose last token sits at position p: rows 0..p-1
read (token q + 1, the target's feature of q); each further row reads the previous proposal and the previous row's
output (the head's own hidden state). reference_beam: the top-k beam (trees) over the same rows."""

from __future__ import annotations

import json
import os
from typing import Callable, List, Sequence

import torch
import torch.nn.functional as F

from sglang.test.eagle_heads import HEAD_DIM, HEADS, KV_HEADS


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    f = pos[:, None].double() * inv[None]
    cos = torch.cat([f.cos(), f.cos()], -1)[:, None].float()
    sin = torch.cat([f.sin(), f.sin()], -1)[:, None].float()
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


class HeadReference:
    def __init__(self, head_dir: str, target_dir: str):
        from safetensors.torch import load_file
        from transformers import LlamaForCausalLM

        with open(os.path.join(head_dir, "config.json")) as f:
            self.cfg = json.load(f)
        self.eagle3 = self.cfg["architectures"][0] == "LlamaForCausalLMEagle3"
        self.W = {k: v.float() if v.is_floating_point() else v
                  for k, v in load_file(os.path.join(head_dir, "model.safetensors")).items()}
        self.target = LlamaForCausalLM.from_pretrained(target_dir, torch_dtype=torch.float32).eval()
        self.E = self.target.model.embed_tokens.weight.detach()
        self.LM = self.target.lm_head.weight.detach()
        eagle = self.cfg.get("eagle_config") or {}
        self.aux = eagle.get("eagle_aux_hidden_state_layer_ids")
        self.eps, self.theta = self.cfg["rms_norm_eps"], self.cfg["rope_theta"]

    @torch.no_grad()
    def features(self, seq: Sequence[int]) -> torch.Tensor:
        """The target's feature of every position: EAGLE-3: the outputs of the aux layers (HF's hidden_states[i + 1]);
        EAGLE-1: the final-normed hidden state (HF's last hidden_states entry)."""
        hs = self.target(torch.tensor([list(seq)]), output_hidden_states=True).hidden_states
        if self.eagle3:
            return torch.cat([hs[i + 1][0] for i in self.aux], -1)
        return hs[-1][0]

    def _attention(self, x: torch.Tensor, pos: torch.Tensor, p: str) -> torch.Tensor:
        W, T = self.W, x.shape[0]
        q = (x @ W[p + "q_proj.weight"].T).view(T, HEADS, HEAD_DIM)
        k = (x @ W[p + "k_proj.weight"].T).view(T, KV_HEADS, HEAD_DIM)
        v = (x @ W[p + "v_proj.weight"].T).view(T, KV_HEADS, HEAD_DIM)
        q, k = _rope(q, pos, self.theta), _rope(k, pos, self.theta)
        k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
        s = torch.einsum("qhd,khd->hqk", q, k) / HEAD_DIM**0.5
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        return torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(T, -1) @ W[p + "o_proj.weight"].T

    def _mlp(self, x: torch.Tensor, p: str) -> torch.Tensor:
        W = self.W
        return (F.silu(x @ W[p + "gate_proj.weight"].T) * (x @ W[p + "up_proj.weight"].T)) @ W[p + "down_proj.weight"].T

    def rows(self, tokens: List[int], h: torch.Tensor, pos: torch.Tensor):
        """(target ids each row predicts, each row's output hidden state); h: the rows' H-wide input (EAGLE-3: after
        fc for target features)."""
        logits, out = self.logits(tokens, h, pos)
        return self.to_target(logits.argmax(-1)), out

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids + self.W["d2t"][ids] if self.eagle3 else ids

    def head_input(self, features: torch.Tensor) -> torch.Tensor:
        """The H-wide hidden input of rows reading target features (EAGLE-3: through fc)."""
        return features @ self.W["fc.weight"].T if self.eagle3 else features

    def logits(self, tokens: List[int], h: torch.Tensor, pos: torch.Tensor):
        """(each row's logits in the head's vocabulary, each row's output hidden state)."""
        W, e = self.W, self.E[torch.tensor(tokens)]
        if self.eagle3:
            x = torch.cat([_rms(e, W["midlayer.input_layernorm.weight"], self.eps),
                           _rms(h, W["midlayer.hidden_norm.weight"], self.eps)], -1)
            r = h + self._attention(x, pos, "midlayer.self_attn.")
            out = r + self._mlp(_rms(r, W["midlayer.post_attention_layernorm.weight"], self.eps), "midlayer.mlp.")
            return _rms(out, W["norm.weight"], self.eps) @ W["lm_head.weight"].T, out
        x = torch.cat([e, h], -1) @ W["fc.weight"].T + W["fc.bias"]
        for i in range(self.cfg["num_hidden_layers"]):
            p = f"layers.{i}."
            a_in = x if i == 0 else _rms(x, W[p + "input_layernorm.weight"], self.eps)
            r = x + self._attention(a_in, pos, p + "self_attn.")
            x = r + self._mlp(_rms(r, W[p + "post_attention_layernorm.weight"], self.eps), p + "mlp.")
        return x @ self.LM.T, x

    @torch.no_grad()
    def proposals(self, seq: Sequence[int], features: torch.Tensor, p: int, k: int) -> List[int]:
        tokens = list(seq[1 : p + 1])
        h = features[:p]
        if self.eagle3:
            h = h @ self.W["fc.weight"].T
        pos = list(range(p))
        out: List[int] = []
        while True:
            ids, hidden = self.rows(tokens, h, torch.tensor(pos))
            out.append(int(ids[-1]))
            if len(out) == k:
                return out
            tokens.append(out[-1])
            h = torch.cat([h, hidden[-1:]])
            pos.append(pos[-1] + 1)


@torch.no_grad()
def reference_beam(run: Callable, tokens: List[int], h: torch.Tensor, width: int, depth: int, to_target: Callable):
    """A plain beam over a head given as run(tokens, h) -> (logits [S, V] in the head's vocabulary, hidden [S, H]) over
    positions 0 .. S-1 (full causal attention, every row recomputed from scratch): rows 0 .. p-1 read tokens[q] (the
    token at q + 1) and h[q] (the target's feature of q, as the head reads it); a beam's further rows read its tokens
    and the hidden state of the row that proposed each. Returns (paths in target ids, cumulative log-probs, the
    smallest gap between the last kept and the best dropped candidate over the steps: a near tie may order either
    way in another float32 computation)."""
    logits, hidden = run(tokens, h)
    lp = torch.log_softmax(logits[-1].double(), -1)
    order = lp.sort(descending=True)
    gap = float(order.values[width - 1] - order.values[width])
    beams = [([int(i)], float(lp[i]), [hidden[-1]]) for i in order.indices[:width]]
    for _ in range(1, depth):
        cands = []
        for ids, score, hs in beams:
            path = [int(t) for t in to_target(torch.tensor(ids))]
            logits, hidden = run(tokens + path, torch.cat([h] + [x[None] for x in hs]))
            lp = torch.log_softmax(logits[-1].double(), -1)
            cands += [(score + float(v), ids + [int(i)], hs + [hidden[-1]]) for v, i in zip(*lp.topk(width + 1))]
        cands.sort(key=lambda c: -c[0])
        gap = min(gap, cands[width - 1][0] - cands[width][0])
        beams = [(ids, score, hs) for score, ids, hs in cands[:width]]
    return [to_target(torch.tensor(ids)).tolist() for ids, _, _ in beams], [score for _, score, _ in beams], gap
