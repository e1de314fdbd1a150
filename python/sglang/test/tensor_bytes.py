"""The reference for the memory plan's weights term in tests: bytes of every parameter and buffer a model holds, each
storage once (tied weights share one), computed here independently of the runner's own count."""


def tensor_bytes(model) -> int:
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.untyped_storage().nbytes()
    return total
