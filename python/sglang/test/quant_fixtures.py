"""Random packed weights for the quantized GEMM kernels' tests (quant_layout.h's record formats), the levels whose
dense path those tests run, and the error bound of one int8 pass of activations (a quantized lm_head's path without
AMX)."""

import torch

# record bytes by format code (bits + 16 * header): header then the 16 x 32 levels
RECORD_BYTES = {4: 64 + 256, 8: 64 + 512, 20: 128 + 256, 24: 128 + 512, 36: 256 + 256, 40: 256 + 512, 56: 64 + 512}


def random_packed(fmt: int, n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """uint8 [tiles, blocks, record bytes]: random level bytes under headers of sane magnitudes for the format."""
    nb, tiles = (k + 31) // 32, (n + 15) // 16
    p = torch.randint(0, 256, (tiles, nb, RECORD_BYTES[fmt]), dtype=torch.uint8, generator=gen)
    head = fmt >> 4

    def put(lo: int, values: torch.Tensor) -> None:
        raw = values.contiguous().view(torch.uint8).view(tiles, nb, -1)
        p[:, :, lo: lo + raw.shape[-1]] = raw

    if head == 0:  # 16 fp16 d, 16 fp16 c
        put(0, (torch.randn(tiles, nb, 32, generator=gen) * 1e-2).half())
    elif head in (1, 2):  # fp32 d, c (halves: two of each)
        put(0, torch.randn(tiles, nb, 32 * head, generator=gen) * 1e-2)
    else:  # Q6_K: 16 fp16 d, then 2 x 16 int8 scales
        put(0, (torch.randn(tiles, nb, 16, generator=gen) * 1e-3).half())
        put(32, torch.randint(-32, 32, (tiles, nb, 32), dtype=torch.int8, generator=gen))
    return p


# quant_path's name of the dense path at each level that has one
DENSE_PATHS = {"amx": "amx_bf16_dense", "avx512_bf16": "avx512_bf16_dense"}


def dense_levels(ops) -> list:
    """The levels at which this CPU runs a dense path (set_cpu_isa can force each): amx and avx512_bf16 on an AMX
    CPU, avx512_bf16 alone on one with AVX-512 BF16 only, none below."""
    native = ops.cpu_isa_native()
    return [level for level in DENSE_PATHS if level == native or native == "amx"]


# quant_path(M, head=True)'s name of the lm_head path with one int8 pass of activations (quant_head_one_pass)
ONE_PASS_PATH = "avx512_vnni_one_pass"


def one_pass_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[M, N]: the most one int8 pass of activations can move each output of x [M, K] @ w [N, K]^T (K whole blocks of
    32): each activation is within half a step (its block's max|x| / 127, halved) of its int8 value, so an output is
    within the sum over blocks of that half step times the block's sum of |w|; plus 1e-5 of the sum of |x| |w| for
    the fp32 arithmetic."""
    xb, wb = x.double().reshape(x.shape[0], -1, 32), w.double().reshape(w.shape[0], -1, 32)
    half_step = xb.abs().amax(-1) / 254
    return half_step @ wb.abs().sum(-1).T + 1e-5 * (x.double().abs() @ w.double().abs().T)
