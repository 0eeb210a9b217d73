"""Benchmark case list of ariadne's GPU benchmarks: loading, validation, mask-aware FLOP counts and
the token orders of the encoder stacks.

Pure Python (no torch) so that CI can test it and scripts/bench-report can use it. The case format
is the one agreed between the anchor script (bench/anchors.py) and ariadne's own benchmark; see
bench/README.md. FLOPs are mask-aware: allowed (query, key) pairs x 4 x head_dim x query heads x
batch (one multiply-add of QK^T and one of PV per pair and dimension, 2 FLOPs each).
"""

import json
import math
import re

BLOCK = 128            # block size of the "blocks:F" masks (query and key blocks)
STACK_LAYERS = 32      # layers of the Qwen2.5-VL-style vision encoder
STACK_HEADS = 16
STACK_DIM = 80
PATCH = 14             # pixels per patch side
WINDOW = 64            # SWA half-width of the Ariadne local layers
CHUNK_UNITS = 4        # Qwen2.5-VL window = 4x4 merge units = 64 tokens
FULL_LAYERS_CHUNK = (7, 15, 23, 31)

ATTN_KEYS = {"id", "batch", "tokens", "heads_q", "heads_kv", "dim", "pattern", "sink", "dtype"}
STACK_KEYS = {"id", "kind", "schedule", "side", "batch"}


class CaseError(ValueError):
    """A case file or case that does not follow the format; the message names the case and field."""


class Pattern:
    """A parsed pattern string: full | causal | window:L,R | chunk:C | blocks:F."""

    def __init__(self, text):
        self.text = text
        self.kind = None
        self.left = self.right = self.chunk = 0
        self.fraction = 0.0
        m = re.fullmatch(r"(full|causal)|window:(\d+),(\d+)|chunk:(\d+)|blocks:([0-9.]+)", text)
        if not m:
            raise CaseError(f"pattern '{text}': expected full, causal, window:L,R, chunk:C or blocks:F")
        if m.group(1):
            self.kind = m.group(1)
        elif m.group(2) is not None:
            self.kind, self.left, self.right = "window", int(m.group(2)), int(m.group(3))
        elif m.group(4) is not None:
            self.kind, self.chunk = "chunk", int(m.group(4))
            if self.chunk < 1:
                raise CaseError(f"pattern '{text}': chunk size must be >= 1")
        else:
            self.kind, self.fraction = "blocks", float(m.group(5))
            if not 0.0 < self.fraction <= 1.0:
                raise CaseError(f"pattern '{text}': block fraction must be in (0, 1]")

    def allowed(self, q, k):
        """Whether query position q may see key position k (blocks: only the causal part; which
        blocks are kept is data, see kept_blocks in anchors.py)."""
        if self.kind == "full":
            return True
        if self.kind in ("causal", "blocks"):
            return k <= q
        if self.kind == "window":
            return q - self.left <= k <= q + self.right
        return q // self.chunk == k // self.chunk


def blocks_kept_count(tokens, fraction):
    """Blocks kept per head by "blocks:F" at `tokens` (a multiple of BLOCK): all nb diagonal
    blocks plus random strictly-lower ones up to floor(F * causal_blocks + 0.5) in total.
    A fixed count makes the FLOPs independent of the random draw."""
    nb = tokens // BLOCK
    causal_blocks = nb * (nb + 1) // 2
    return min(causal_blocks, max(nb, int(math.floor(fraction * causal_blocks + 0.5))))


def allowed_pairs(pattern, tokens):
    """Allowed (query, key) pairs of one head for a pattern over `tokens` positions (closed form)."""
    p = pattern if isinstance(pattern, Pattern) else Pattern(pattern)
    n = tokens
    if p.kind == "full":
        return n * n
    if p.kind == "causal":
        return n * (n + 1) // 2
    if p.kind == "window":
        # Row i sees keys max(0, i - l) .. min(n - 1, i + r): l + r + 1 keys less those cut off
        # at either end, w (w + 1) / 2 for a side of width w. A width beyond n - 1 cuts exactly as
        # much as n - 1 does, hence the clamp.
        left, right = min(p.left, n - 1), min(p.right, n - 1)
        return n * (left + right + 1) - left * (left + 1) // 2 - right * (right + 1) // 2
    if p.kind == "chunk":
        full, rest = divmod(n, p.chunk)
        return full * p.chunk * p.chunk + rest * rest
    kept = blocks_kept_count(n, p.fraction)
    nb = n // BLOCK
    return nb * BLOCK * (BLOCK + 1) // 2 + (kept - nb) * BLOCK * BLOCK


def attention_flops(case):
    """Mask-aware FLOPs of one attention case."""
    return 4 * allowed_pairs(case["pattern"], case["tokens"]) * case["dim"] * case["heads_q"] * case["batch"]


def validate(case):
    """Checks one case dict; raises CaseError naming the case and the field."""
    cid = case.get("id", "<no id>")
    if not isinstance(case.get("id"), str) or not case["id"]:
        raise CaseError(f"case {cid}: field 'id' must be a non-empty string")
    if case.get("kind") == "stack":
        if set(case) != STACK_KEYS:
            raise CaseError(f"case {cid}: stack case fields must be {sorted(STACK_KEYS)}, got {sorted(case)}")
        if case["schedule"] not in ("full", "chunk", "ariadne"):
            raise CaseError(f"case {cid}: field 'schedule' must be full, chunk or ariadne")
        side = case["side"]
        if not isinstance(side, int) or side <= 0 or side % (2 * PATCH):
            raise CaseError(f"case {cid}: field 'side' must be a positive multiple of {2 * PATCH} pixels")
        if not isinstance(case["batch"], int) or case["batch"] != 1:
            raise CaseError(f"case {cid}: field 'batch' must be 1 for stack cases")
        return
    if set(case) != ATTN_KEYS:
        raise CaseError(f"case {cid}: fields must be {sorted(ATTN_KEYS)}, got {sorted(case)}")
    for f in ("batch", "tokens", "heads_q", "heads_kv", "dim"):
        if not isinstance(case[f], int) or case[f] <= 0:
            raise CaseError(f"case {cid}: field '{f}' must be a positive integer")
    if case["heads_q"] % case["heads_kv"]:
        raise CaseError(f"case {cid}: field 'heads_q' must be a multiple of 'heads_kv'")
    try:
        p = Pattern(case["pattern"])
    except CaseError as e:
        raise CaseError(f"case {cid}: field {e}") from None
    if p.kind == "blocks" and case["tokens"] % BLOCK:
        raise CaseError(f"case {cid}: field 'tokens' must be a multiple of {BLOCK} for blocks patterns")
    if case["sink"] not in ("none", "denominator"):
        raise CaseError(f"case {cid}: field 'sink' must be none or denominator")
    if case["dtype"] != "bf16":
        raise CaseError(f"case {cid}: field 'dtype' must be bf16")


def load_cases(path):
    """Reads and validates a case file; ids must be unique."""
    try:
        with open(path) as f:
            cases = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CaseError(f"{path}: cannot read the case list: {e}") from None
    if not isinstance(cases, list):
        raise CaseError(f"{path}: expected a JSON list of cases")
    seen = set()
    for c in cases:
        if not isinstance(c, dict):
            raise CaseError(f"{path}: every case must be a JSON object")
        validate(c)
        if c["id"] in seen:
            raise CaseError(f"{path}: duplicate case id '{c['id']}'")
        seen.add(c["id"])
    return cases


# ---- encoder stacks -------------------------------------------------------------------------

def stack_layers(schedule):
    """Per-layer (pattern, sink, order) of a 32-layer encoder schedule. order is the token order
    the layer runs in ("row" = block row-major, the native order; "col" = block column-major;
    "window" = Qwen2.5-VL window order) or None for full layers, which run in whatever order the
    tokens are in (full attention does not depend on the order)."""
    win = f"window:{WINDOW},{WINDOW}"
    if schedule == "full":
        return [("full", "none", None)] * STACK_LAYERS
    if schedule == "chunk":
        chunk = f"chunk:{CHUNK_UNITS * CHUNK_UNITS * 4}"
        return [("full", "none", None) if i in FULL_LAYERS_CHUNK else (chunk, "none", "window")
                for i in range(STACK_LAYERS)]
    if schedule == "ariadne":
        block = [(win, "denominator", "row")] * 4 + [(win, "denominator", "col")] * 3 + [("full", "none", None)]
        return block * (STACK_LAYERS // 8)
    raise CaseError(f"schedule '{schedule}': expected full, chunk or ariadne")


def stack_tokens(side):
    return (side // PATCH) ** 2


def stack_flops(case):
    """Mask-aware FLOPs of a whole stack (the permutations move data and count none)."""
    n = stack_tokens(case["side"])
    return sum(4 * allowed_pairs(p, n) * STACK_DIM * STACK_HEADS * case["batch"]
               for p, _, _ in stack_layers(case["schedule"]))


def order_permutation(kind, hp, wp):
    """perm[new_position] = native position, for an hp x wp patch grid (both even). The native
    order is block row-major (merge units of 2x2 patches left to right, top to bottom, each unit's
    4 patches in raster order), as Qwen2.5-VL's patch rows come. "col": units top to bottom, then
    left to right, each unit's inner order kept. "window": windows of 4x4 units in raster order
    (the unit grid padded logically to multiples of 4, empty windows dropped), units in raster
    order inside a window."""
    if hp % 2 or wp % 2:
        raise CaseError(f"grid {hp}x{wp}: both sides must be even (2x2 merge units)")
    hu, wu = hp // 2, wp // 2

    def unit_tokens(ur, uc):
        base = (ur * wu + uc) * 4
        return [base, base + 1, base + 2, base + 3]

    perm = []
    if kind == "row":
        perm = list(range(hp * wp))
    elif kind == "col":
        for uc in range(wu):
            for ur in range(hu):
                perm += unit_tokens(ur, uc)
    elif kind == "window":
        for wr in range(0, hu, CHUNK_UNITS):
            for wc in range(0, wu, CHUNK_UNITS):
                for ur in range(wr, min(wr + CHUNK_UNITS, hu)):
                    for uc in range(wc, min(wc + CHUNK_UNITS, wu)):
                        perm += unit_tokens(ur, uc)
    else:
        raise CaseError(f"order '{kind}': expected row, col or window")
    return perm


def window_seqlens(hp, wp):
    """Cumulative token counts of the Qwen2.5-VL windows of an hp x wp patch grid."""
    hu, wu = hp // 2, wp // 2
    cu = [0]
    for wr in range(0, hu, CHUNK_UNITS):
        for wc in range(0, wu, CHUNK_UNITS):
            units = (min(wr + CHUNK_UNITS, hu) - wr) * (min(wc + CHUNK_UNITS, wu) - wc)
            cu.append(cu[-1] + 4 * units)
    return cu


def inverse(perm):
    inv = [0] * len(perm)
    for new, old in enumerate(perm):
        inv[old] = new
    return inv
