"""Estimators and prefill from Python: RRAttention's and the oracle's block scores against numpy
implementations of estimate.hpp's formulas, the selection rule against the returned scores, and a
prefill against the numpy attention reference on the estimated mask."""

import math

import numpy as np
import pytest

import ariadne
from conftest import close, reference

L, HQ, HKV, D, B, S = 200, 4, 2, 32, 32, 8


def inputs(rng):
    q = rng.standard_normal((L, HQ, D)).astype(np.float32)
    k = rng.standard_normal((L, HKV, D)).astype(np.float32)
    # A few strong keys, so that the masks are far from uniform.
    k[rng.choice(L, 6, replace=False)] *= 4
    return q, k


def rows_of(result, h, m, nqb):
    r = h * nqb + m
    return result.scores[result.score_ptr[r]:result.score_ptr[r + 1]]


def rr_scores_numpy(q, k, offset):
    """Per (head, query block): normalized scores of key blocks 0..diag (one sequence, lq == lk)."""
    scale = 1 / math.sqrt(D)
    n_strides = -(-L // S)
    kbar = np.zeros((n_strides, HKV, D))
    for j in range(n_strides):
        kbar[j] = k[j * S:(j + 1) * S].astype(np.float64).sum(0)
    nqb = -(-L // B)
    out = {}
    for h in range(HQ):
        g = h // (HQ // HKV)
        probs = np.zeros((n_strides, n_strides))
        for i in range(n_strides):
            off = S - 1 - (h % S) if offset == "paper" else h % S
            p = min(i * S + off, L - 1)
            vis = [j for j in range(n_strides) if j * S <= p]
            logits = np.array([scale * q[p, h].astype(np.float64) @ kbar[j, g] / S for j in vis])
            e = np.exp(logits - logits.max())
            probs[i, vis] = e / e.sum()
        for m in range(nqb):
            diag = (min((m + 1) * B, L) - 1) // B
            blk = np.array([probs[m * B // S:(m + 1) * B // S, n * B // S:(n + 1) * B // S].sum()
                            for n in range(diag + 1)])
            out[h, m] = blk / blk.sum()
    return out


@pytest.mark.parametrize("offset", ["paper", "released"])
def test_rr_scores_match_numpy(rng, offset):
    q, k = inputs(rng)
    res = ariadne.rr_estimate(q, k, tau=0.9, stride=S, block=B, offset=offset)
    ref = rr_scores_numpy(q, k, offset)
    nqb = -(-L // B)
    assert res.rows == HQ * nqb
    for (h, m), want in ref.items():
        np.testing.assert_allclose(rows_of(res, h, m, nqb), want, rtol=1e-4, atol=1e-6)
    assert res.mask.block == B and res.mask.heads == HQ and 0 < res.stats.density <= 1


def test_oracle_scores_are_block_masses(rng):
    q, k = inputs(rng)
    res = ariadne.estimate(q, k, method="oracle", tau=0.9, stride=S, block=B)
    _, _, mats = reference(q, k, k, ariadne.Pattern.causal())
    nqb = -(-L // B)
    for h in range(HQ):
        a = mats[h]
        for m in range(nqb):
            q_lo, q_hi = m * B, min((m + 1) * B, L)
            want = np.array([a[q_lo:q_hi, n * B:(n + 1) * B].sum() for n in range((q_hi - 1) // B + 1)]) / (q_hi - q_lo)
            np.testing.assert_allclose(rows_of(res, h, m, nqb), want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("tau", [0.5, 0.9, 0.99])
def test_selection_without_protections_follows_the_scores(rng, tau):
    q, k = inputs(rng)
    res = ariadne.rr_estimate(q, k, tau=tau, stride=S, block=B, protect=[])
    nqb = -(-L // B)
    for h in range(HQ):
        dense = res.mask.to_dense(0, h, L, L)
        for m in range(nqb):
            s = rows_of(res, h, m, nqb).astype(np.float64)
            order = sorted(range(len(s)), key=lambda n: (-s[n], n))  # ties: smaller block first
            kept, mass = [], 0.0
            for n in order:
                if mass >= tau * s.sum():
                    break
                kept.append(n)
                mass += s[n]
            assert sorted(np.nonzero(dense[m])[0].tolist()) == sorted(kept), (h, m)


def test_published_protections_and_oracle_metrics(rng):
    q, k = inputs(rng)
    rr = ariadne.rr_estimate(q, k, tau=0.5, stride=S, block=B)
    nqb = -(-L // B)
    for h in range(HQ):
        d = rr.mask.to_dense(0, h, L, L)
        assert d[:, 0].all() and all(d[m, m] for m in range(nqb))  # sink and diagonal
        assert d[nqb - 1].all()  # the last query block keeps every block
    oracle = ariadne.estimate(q, k, method="oracle", tau=0.9, stride=S, block=B)
    metrics = ariadne.compare_to_oracle(rr.mask, oracle)
    assert 0 < metrics.mass_recall <= 1 and 0 <= metrics.f1 <= 1
    self_metrics = ariadne.compare_to_oracle(oracle.mask, oracle)
    assert self_metrics.f1 == 1.0 and self_metrics.precision == 1.0


def test_prefill_matches_attention_on_its_mask(rng):
    q, k = inputs(rng)
    v = rng.standard_normal(k.shape).astype(np.float32)
    out, lse, result = ariadne.prefill(q, k, v, tau=0.9, stride=S, block=B, lse=True, attention_backend="reference")
    mask = result.estimate.mask
    ref_out, ref_lse, _ = reference(q, k, v, ariadne.Pattern.causal(), mask=mask)
    close(out, ref_out, "float32", np.abs(q).max() * np.abs(k).max() * math.sqrt(D))
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5)
    dense_out, _, dense = ariadne.prefill(q, k, v, dense=True, attention_backend="reference")
    assert dense.stats.density == 1
    close(dense_out, reference(q, k, v, ariadne.Pattern.causal())[0], "float32", 1.0)


def test_estimator_errors():
    q = np.zeros((64, 4, 16), np.float32)
    with pytest.raises(ValueError, match="stride"):
        ariadne.rr_estimate(q, q, stride=7, block=32)
    with pytest.raises(ValueError, match="protect: 'edges'"):
        ariadne.rr_estimate(q, q, protect=["edges"])
    with pytest.raises(ValueError, match="'bogus'"):
        ariadne.estimate(q, q, method="bogus")


def test_rr_sample_positions():
    assert [ariadne.rr_sample_position("paper", 8, 2, h, 100) for h in (0, 1, 9)] == [23, 22, 22]
    assert [ariadne.rr_sample_position("released", 8, 2, h, 100) for h in (0, 1, 9)] == [16, 17, 17]
    assert ariadne.rr_sample_position("paper", 8, 12, 0, 100) == 99  # clamped to the last query
