"""Byte units. Binary everywhere: GiB = 2**30, MiB = 2**20 (nvidia-smi and rocm report MiB)."""

MiB = 1 << 20
GiB = 1 << 30


def gib(num_bytes: int | float) -> float:
    return num_bytes / GiB
