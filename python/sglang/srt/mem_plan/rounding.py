"""Integer rounding every size uses: ceil division (a shard of n over tp ranks, blocks of a row) and page alignment."""


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def align_up(value: int, page: int) -> int:
    return cdiv(value, page) * page
