#!/usr/bin/env python3
"""The anchors' backward on the cases of bench/cases.json: PyTorch SDPA (cuDNN and flash backends)
and FlexAttention (compiled, 128 and 64 blocks), each through the forward runner bench/anchors.py
builds for the forward table, differentiated by torch autograd.

Per case and implementation: "ms" is the backward alone (torch.autograd.grad of the saved forward
graph with a random dout, retain_graph=True), "ms_fwdbwd" forward + backward, both medians of
single calls timed as the forward anchors are (anchors.Timer: a sleep kernel ahead of each call,
events around it, inputs rotated past the L2). TFLOP/s at 2.5x the forward's FLOPs. The forward
output is checked against the fp32 reference first, as in anchors.py. ariadne's own backward
comes from `bench_attention_cuda --backward` on the same cases.

    python3 bench/anchors_backward.py --out anchors_backward.json [--cases bench/cases.json] [--ids vit-,llm-n8192]
"""

import argparse
import json
import os
import signal
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import anchors as A  # noqa: E402
import casespec as cs  # noqa: E402

IMPLS = ("sdpa_cudnn", "sdpa_flash", "flex", "flex_b64")


def grad_sets(spec, runner, first, dev):
    """Rotated sets (out, q, k, v, dout): each a forward graph kept for its backward."""
    sets = []
    for q, k, v in A.make_sets(spec, runner, first, dev, smoke=False):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out = runner.call(q, k, v)
        dout = torch.randn_like(out)
        sets.append((out, q, k, v, dout))
    return sets


def backward(out, q, k, v, dout):
    return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def run_case(case, impls, dev, timer, budget):
    spec = A.Spec(case)
    flops = 2.5 * cs.attention_flops(case)
    gen = torch.Generator(device=dev).manual_seed(spec.seed)
    first = A.alloc_qkv(spec, "bhnd", gen, dev)
    sinks = A.sink_logits(spec, dev) if spec.sink else None
    kept = A.kept_blocks(spec, dev) if spec.pattern.kind == "blocks" else None
    rows = A.check_rows(spec, spec.seed + 3, dev)
    ref = A.reference_rows(spec, *first, sinks, kept, rows)
    out = []
    for impl in A.impls_for(spec, impls):
        t0 = time.monotonic()
        signal.alarm(budget)
        try:
            runner, got = A.build_runner(impl, spec, dev, kept, sinks, first)
            err = A.rel_error(got[:, :, rows], ref)
            if not err <= A.TOLERANCE:
                out.append(A.record(spec.id, impl, None, flops, f"WRONG RESULT: forward rel err {err:.3g}; not timed"))
                continue
            sets = grad_sets(spec, runner, first, dev)
            backward(*sets[0])  # compiles the backward (Flex) before timing
            ms, reps = timer.measure(backward, sets)

            def fwd_bwd(q, k, v, dout):
                return torch.autograd.grad(runner.call(q, k, v), (q, k, v), dout)

            ms_fb, _ = timer.measure(fwd_bwd, [s[1:] for s in sets])
            note = "; ".join(runner.notes + [f"{reps} reps, {len(sets)} buffer sets"])
            out.append(A.record(spec.id, impl, ms, flops, note, ms_fwdbwd=round(ms_fb, 5)))
        except A.Unsupported as e:
            out.append(A.record(spec.id, impl, None, flops, f"unsupported: {e}"))
        except A.OverBudget:
            out.append(A.record(spec.id, impl, None, flops, f"skipped: over the {budget} s budget"))
        except torch.OutOfMemoryError as e:
            out.append(A.record(spec.id, impl, None, flops, f"failed: out of memory: {str(e)[:200]}"))
        except Exception as e:  # an anchor without a backward for this case
            out.append(A.record(spec.id, impl, None, flops, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"))
        finally:
            signal.alarm(0)
            torch.cuda.empty_cache()
        print(f"  {spec.id:28s} {impl:11s} bwd {out[-1]['ms']} ms  {out[-1]['tflops']} TF/s  "
              f"({time.monotonic() - t0:.1f} s) {out[-1]['note'][:100]}", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases.json"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--ids", default="", help="comma-separated id prefixes (default: every attention case)")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--budget", type=int, default=90, help="seconds per implementation and case")
    args = ap.parse_args(argv)
    # FlexAttention's compiled backward frees buffers it donated to the forward unless told not to,
    # which a backward run again on the same graph (retain_graph) needs.
    torch._functorch.config.donated_buffer = False
    signal.signal(signal.SIGALRM, A._alarm)
    dev = torch.device("cuda")
    timer = A.Timer(dev, target_s=0.4)
    with open(args.cases) as f:
        cases = [c for c in json.load(f) if c.get("kind", "attention") != "stack"]
    prefixes = [p for p in args.ids.split(",") if p]
    if prefixes:
        cases = [c for c in cases if any(c["id"].startswith(p) for p in prefixes)]
    results = [{"id": "env", "env": A.env_info(dev)}]
    for case in cases:
        results += run_case(case, args.impls.split(","), dev, timer, args.budget)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
