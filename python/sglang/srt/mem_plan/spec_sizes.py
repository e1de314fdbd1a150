"""Byte sizes and caps of speculative decoding (speculative/spec_args.py): defined here once, read by the planner,
`sglang plan` and the runtime that allocates or stays within them. Torch-free, no imports beyond sizes.py.

A verify forward holds every running request's verify rows: at most max_running_requests x verify_rows_per_request
rows, capped by the chunked-prefill size so the forward's activations stay within the profiled prefill peak (the
activation term). A chain's rows are its num_draft_tokens (the last token + its proposals). A tree's
(--speculative-eagle-topk > 1) are its branches EXPANDED (managers/spec_tree.py): B branches of depth D take
B x (D + 1) rows, not upstream's num_draft_tokens = nodes + 1 (B x D + 1 for a full tree; the flag keeps that meaning;
the plan prices the expanded rows, tree_shape below being the one definition of the tree the runtime builds). The
B - 1 side branches of each tree also take request-table rows of their own (branch_rows: R x (B - 1) at a full
batch, capped by the policy's budget), which the req_to_token term, the attention backends' per-sequence buffers and
a quantized KV's window map price beside the R request slots. Each
row's logits are kept, so the logits/sampler term is that of verify_token_cap rows instead of one row per request
slot; an EAGLE head / MTP layer also keeps the target's hidden state of every verify row (EAGLE3: three layers').

A draft model's KV pool (STANDALONE, EAGLE heads, NEXTN's MTP layers) is indexed by the SAME token slots as the
target's pool: slot i of the target's pool and row i of the draft's belong to the same token. So the draft's pool has
the target's rows (T + one dummy page) of its own cell, and the solver's cost of a token is target cell + draft cell.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.mem_plan.sizes import kv_pool_rows


# CPU: the most tokens one verify forward holds, whatever the slots (the adaptive policy's batch budget,
# managers/spec_policy.py: a CPU forward's cost grows with its rows, so batch 1 proposes its chain and large batches
# decode without proposals). The plan prices the same rows: max(slots, min(slots x draft tokens, chunk, this)).
CPU_VERIFY_TOKEN_BUDGET = 16


def verify_budget_tokens(device_kind: str) -> int:
    """The runtime's cap on a verify forward's tokens beyond verify_token_cap: CPU_VERIFY_TOKEN_BUDGET on a CPU,
    0 (none) elsewhere."""
    return CPU_VERIFY_TOKEN_BUDGET if device_kind == "cpu" else 0


def tree_shape(max_k: int, topk: int, num_steps: int, max_nodes: int) -> tuple:
    """(branches, depth) of the tree a request allowed max_k + 1 expanded rows gets (managers/spec_tree.py builds
    it): the deepest first, depth min(num_steps, max_k, max_nodes), then as many branches (<= topk) as keep the rows
    branches x (depth + 1) within max_k + 1 and the nodes branches x depth within max_nodes (num_draft_tokens - 1).
    (0, 0) when max_k or max_nodes is 0."""
    depth = min(num_steps, max_k, max_nodes)
    if depth <= 0:
        return 0, 0
    return max(1, min(topk, (max_k + 1) // (depth + 1), max_nodes // depth)), depth


def verify_rows_per_request(topk: int, num_steps: int, num_draft_tokens: int) -> int:
    """The most rows one request takes in a verify forward: a chain (topk 1) its num_draft_tokens; a tree the
    expanded rows branches x (depth + 1) of the largest tree tree_shape builds when nothing but the flags limits it.
    The plan's verify rows, the runtime's verify budget and the policy's per-request cap all read this.
    A tree's side branches also take request-table rows of their own: branch_rows."""
    if topk <= 1:
        return num_draft_tokens
    branches, depth = largest_tree(topk, num_steps, num_draft_tokens)
    return branches * (depth + 1)


def largest_tree(topk: int, num_steps: int, num_draft_tokens: int) -> tuple:
    """(B, D): branches and depth of the largest tree tree_shape builds (verify_rows_per_request's); (1, 0) for a
    chain. Every tree with more than one branch has depth D exactly: tree_shape goes deepest first, and at a smaller
    depth (max_k < D) its rows budget holds a single branch."""
    if topk <= 1:
        return 1, 0
    # max_k: the full beam's expanded rows - 1, which no rows budget of a smaller tree binds
    return tree_shape(topk * (num_steps + 1), topk, num_steps, num_draft_tokens - 1)


def branch_rows(num_reqs: int, branches: int, depth: int, budget_tokens: int) -> int:
    """Request-table rows beyond the R request slots for the side branches of one verify forward's trees
    (managers/spec_tree.py; mem_cache/memory_pool.ReqToTokenPool.alloc_branch): a tree keeps branch 0 in its
    request's own row and gives each other branch a row holding a copy of the prefix. The most a forward can hold:
    t trees with side branches have at most min(t x B, F) branches in all, F = budget // (D + 1) (the policy gives a
    forward at most budget_tokens rows, policy_budget, and each branch of such a tree holds D + 1), so
    max over 1 <= t <= R of min(t x B, F) - t: R x (B - 1) when the budget holds every tree whole. Nondecreasing in
    num_reqs (the token solve relies on it)."""
    if branches <= 1 or num_reqs <= 0:
        return 0
    whole = budget_tokens // (depth + 1)
    trees = {min(num_reqs, max(1, whole // branches)), min(num_reqs, max(1, -(-whole // branches)))}
    return max(0, max(min(t * branches, whole) - t for t in trees))


def policy_budget(max_running_requests: int, rows_per_request: int, chunked_prefill_size: int,
                  device_cap_tokens: int) -> int:
    """verify_budget with the device's cap given as a count (0: none)."""
    cap = verify_token_cap(max_running_requests, rows_per_request, chunked_prefill_size)
    return min(cap, device_cap_tokens) if device_cap_tokens else cap


def verify_budget(max_running_requests: int, rows_per_request: int, chunked_prefill_size: int,
                  device_kind: str) -> int:
    """The runtime's cap on a verify forward's tokens (managers/spec_policy.py's batch budget): every slot's rows,
    at most the chunk (verify_token_cap), and on a CPU at most CPU_VERIFY_TOKEN_BUDGET. The plan prices
    max(slots, this) rows (SpecInputs.verify_tokens): a batch of decodes holds one row per request whatever the
    budget."""
    return policy_budget(max_running_requests, rows_per_request, chunked_prefill_size,
                         verify_budget_tokens(device_kind))


def verify_token_cap(max_running_requests: int, rows_per_request: int, chunked_prefill_size: int) -> int:
    """Most tokens one verify forward holds: every slot's rows_per_request (verify_rows_per_request), at most the
    chunked-prefill size (the activation profile's token count; -1 / 0: no chunking, no cap beyond the slots), and
    never fewer than one per slot (a decode step). Nondecreasing in max_running_requests (the token solve relies on
    it)."""
    full = max_running_requests * rows_per_request
    if chunked_prefill_size is None or chunked_prefill_size <= 0:
        return full
    return max(max_running_requests, min(full, chunked_prefill_size))


def draft_kv_pool_bytes(num_tokens: int, page_size: int, cell_bytes: int, fixed_bytes: int = 0) -> int:
    """The draft's KV pool over the target's token slots: (T + one dummy page) rows of the draft cell + its fixed
    scales."""
    return kv_pool_rows(num_tokens, page_size) * cell_bytes + fixed_bytes if cell_bytes else 0


@dataclass(frozen=True)
class SpecInputs:
    """What speculative decoding adds to the plan's inputs (mem_plan/spec_terms.py builds it from the flags and the
    draft's config.json). Bytes are one rank's."""

    algorithm: str  # NGRAM / STANDALONE / EAGLE / EAGLE3 / NEXTN
    num_draft_tokens: int  # --speculative-num-draft-tokens (upstream's: a chain's proposals + 1, a tree's nodes + 1)
    verify_rows_per_req: int  # rows a request takes in a verify forward (verify_rows_per_request: a tree expanded)
    verify_row_bytes: int  # sampler/logits bytes of one verify row (sizes.sampler_bytes_per_slot)
    hidden_row_bytes: int = 0  # target hidden states an EAGLE head / MTP layer reads, per verify row
    draft_weight_bytes: int = 0
    draft_kv_cell_bytes: int = 0  # per token of the shared slots
    draft_kv_fixed_bytes: int = 0  # fp8 scales of the draft's layers
    draft_cuda_graph_bytes: int = 0
    draft: str = ""  # what the draft is, for the table (model_type, layers, dtype)
    draft_dtype: str = ""
    draft_num_layers: int = 0  # KV layers of the draft (an EAGLE head: 1)
    verify_budget_tokens: int = 0  # the device's cap on a verify forward's tokens (verify_budget_tokens), 0: none
    tree_branches: int = 1  # B of the largest tree (largest_tree): each request's side branches take B - 1 rows
    tree_depth: int = 0  # its D: every branch of a tree with side branches holds D + 1 verify rows
    # the draft's own attention backend (model_executor/draft_runner.py): its persistent buffers, sized for every
    # request-table row (a tree's beam decodes the slots' rows and the branch rows in one batch)
    draft_workspace_fixed_bytes: int = 0
    draft_workspace_per_row_bytes: int = 0
    draft_workspace_detail: str = ""
    weights_detail: str = ""
    graphs_detail: str = ""

    def __post_init__(self):
        for name in ("verify_row_bytes", "hidden_row_bytes", "draft_weight_bytes", "draft_kv_cell_bytes",
                     "draft_kv_fixed_bytes", "draft_cuda_graph_bytes", "draft_workspace_fixed_bytes",
                     "draft_workspace_per_row_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"SpecInputs.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("num_draft_tokens", "verify_rows_per_req", "tree_branches"):
            if getattr(self, name) < 1:
                raise ValueError(f"SpecInputs.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def row_bytes(self) -> int:
        """Bytes one verify row holds at once: its sampler rows and the hidden states the draft reads."""
        return self.verify_row_bytes + self.hidden_row_bytes

    def cap_tokens(self, chunked_prefill_size: int) -> int:
        """verify_token_cap's cap: the chunk, or the device's budget when smaller (<= 0: none)."""
        caps = [c for c in (chunked_prefill_size, self.verify_budget_tokens) if c and c > 0]
        return min(caps) if caps else 0

    def verify_tokens(self, num_reqs: int, chunked_prefill_size: int) -> int:
        return verify_token_cap(num_reqs, self.verify_rows_per_req, self.cap_tokens(chunked_prefill_size))

    def branch_rows(self, num_reqs: int, chunked_prefill_size: int) -> int:
        """The request table's side-branch rows at R slots (branch_rows under the policy's budget)."""
        budget = policy_budget(num_reqs, self.verify_rows_per_req, chunked_prefill_size, self.verify_budget_tokens)
        return branch_rows(num_reqs, self.tree_branches, self.tree_depth, budget)

    def draft_workspace_bytes(self, num_reqs: int, chunked_prefill_size: int) -> int:
        """The draft backend's buffers at R slots: sized for the R + branch_rows rows of the request table."""
        rows = num_reqs + self.branch_rows(num_reqs, chunked_prefill_size)
        return self.draft_workspace_fixed_bytes + self.draft_workspace_per_row_bytes * rows


@dataclass(frozen=True)
class SpecPlan:
    """The speculative part of a MemoryPlan (MemoryPlan.speculative), what the runtime allocates from:
    the draft's KV pool = draft_kv_bytes (draft_kv_rows rows of draft_kv_cell_bytes + draft_kv_fixed_bytes, the same
    rows as the target's pool), its weights <= draft_weight_bytes, a verify forward <= verify_tokens tokens."""

    algorithm: str
    num_draft_tokens: int
    verify_rows_per_req: int  # a request's rows in a verify forward (a tree's expanded: verify_rows_per_request)
    verify_tokens: int  # verify_token_cap(max_running_requests, verify_rows_per_req, chunk or the CPU budget)
    verify_row_bytes: int
    hidden_row_bytes: int
    draft_weight_bytes: int
    draft_kv_cell_bytes: int
    draft_kv_fixed_bytes: int
    draft_kv_rows: int  # max_total_num_tokens + page_size: the target pool's rows
    draft_kv_bytes: int
    draft_cuda_graph_bytes: int
    draft: str
    draft_dtype: str
    draft_num_layers: int
    verify_budget_tokens: int = 0  # a CPU's cap on verify tokens (CPU_VERIFY_TOKEN_BUDGET), 0: none
    tree_branches: int = 1  # B of the largest tree
    branch_rows: int = 0  # request-table rows for side branches beyond the request slots (spec_sizes.branch_rows)
    draft_workspace_bytes: int = 0  # the draft attention backend's persistent buffers (term draft_attention_workspace)

    @classmethod
    def of(cls, s: SpecInputs, num_tokens: int, num_reqs: int, page_size: int, chunked_prefill_size: int):
        return cls(s.algorithm, s.num_draft_tokens, s.verify_rows_per_req, s.verify_tokens(num_reqs, chunked_prefill_size),
                   s.verify_row_bytes, s.hidden_row_bytes, s.draft_weight_bytes, s.draft_kv_cell_bytes,
                   s.draft_kv_fixed_bytes, kv_pool_rows(num_tokens, page_size) if s.draft_kv_cell_bytes else 0,
                   draft_kv_pool_bytes(num_tokens, page_size, s.draft_kv_cell_bytes, s.draft_kv_fixed_bytes),
                   s.draft_cuda_graph_bytes, s.draft, s.draft_dtype, s.draft_num_layers, s.verify_budget_tokens,
                   s.tree_branches, s.branch_rows(num_reqs, chunked_prefill_size),
                   s.draft_workspace_bytes(num_reqs, chunked_prefill_size))
