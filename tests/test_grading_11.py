"""Chapter 11's graders: they pass right answers and name the mistake in wrong ones."""
import torch
from helpers import grader_tests

from specdec_lab import grading, measure
from specdec_lab.decoding import generate


def _bound(flop_per_byte=lambda n, b: 2 * n / b, peak=False, turned=False):
    def compute_bound_at(bandwidth, rates, bytes_per_param):
        top = max(rates.values())
        for n in sorted(rates):
            ridge = (top if peak else rates[n]) / bandwidth
            if (flop_per_byte(n, bytes_per_param) <= ridge) if turned else (flop_per_byte(n, bytes_per_param) >= ridge):
                return n
        return None

    return compute_bound_at


def _measure_v(scale=1.0):
    def measure_v(model, ns):
        _, v = measure.cost_ratios(measure.forward_costs({"target": model}, ns, rounds=6))
        return {n: 1 + (x - 1) * scale if n > 1 else x for n, x in v.items()}

    return measure_v




def _predict(kind="right"):
    def read(v, n):
        keys = sorted(v)
        n = min(max(n, keys[0]), keys[-1])
        a, b = max(k for k in keys if k <= n), min(k for k in keys if k >= n)
        return v[a] if a == b else v[a] + (v[b] - v[a]) * (n - a) / (b - a)

    def predicted_speedup(tau, nodes, levels, v, c):
        if kind == "v(N)":
            return tau / (read(v, nodes) + levels * c)
        if kind == "no drafting":
            return tau / read(v, nodes + 1)
        if kind == "tau - 1":
            return (tau - 1) / (read(v, nodes + 1) + levels * c)
        if kind == "nearest":
            return tau / (v[min(v, key=lambda k: abs(k - nodes - 1))] + levels * c)
        return tau / (read(v, nodes + 1) + levels * c)

    return predicted_speedup




def _token(kind="right"):
    def draft_vocab_token(p, draft_logits, d2t, generator):
        small = torch.softmax(draft_logits, -1)                        # [k]: what the draft samples from
        i = int(torch.multinomial(small, 1, generator=generator))
        x = int(d2t[i])
        q = torch.zeros_like(p)
        if kind == "zeros":  # logits scattered with 0 (not -inf) outside, then a softmax over the whole vocabulary
            full = torch.zeros_like(p)
            full[d2t] = draft_logits
            q = torch.softmax(full, -1)
        else:
            q[d2t] = small
        if torch.rand((), generator=generator) < min(1.0, float(p[x] / q[x])):
            return x
        residual = (p - q).clamp(min=0)
        if kind == "renormalised":  # the residual kept to the draft vocabulary
            keep = torch.zeros_like(p)
            keep[d2t] = residual[d2t]
            residual = keep if keep.sum() > 0 else torch.zeros_like(p).index_fill(0, d2t, 1.0)
        return int(torch.multinomial(residual / residual.sum(), 1, generator=generator))

    return draft_vocab_token



def _run(kind="right"):
    def sampled_run(target, ids, make_drafter, temperature, seed):
        g = torch.Generator().manual_seed(seed) if kind != "unseeded" else None
        T = 0.0 if kind == "greedy" else temperature
        gen = generate(target, ids, make_drafter(), 32, temperature=T, generator=g)
        tau = {"accepted": sum(gen.accept_lengths) / gen.target_calls, "alpha": gen.acceptance_rate}.get(kind, gen.tau)
        return gen.tokens, tau

    return sampled_run


def _free(model, ns):
    """"Verification is free": v(n) = 1, not measured."""
    return {n: 1.0 for n in ns}


def _linear(model, ns):
    """v(n) = n, as if n tokens took n one-token steps: not measured."""
    return {n: float(n) for n in ns}


WRONG = [
    (grading.check_compute_bound, (_bound(flop_per_byte=lambda n, b: 2 * n), _measure_v()), "2n / b FLOP per byte"),
    (grading.check_compute_bound, (_bound(peak=True), _measure_v()), "PEAK rate"),
    (grading.check_compute_bound, (_bound(turned=True), _measure_v()), "turned round"),
    (grading.check_compute_bound, (_bound(), _free), "this machine measures"),
    (grading.check_compute_bound, (_bound(), _linear), "this machine measures"),
    (grading.check_predicted_speedup, _predict("v(N)"), "v(N) instead of v(N + 1)"),
    (grading.check_predicted_speedup, _predict("no drafting"), "drafting is left out"),
    (grading.check_predicted_speedup, _predict("tau - 1"), "τ - 1"),
    (grading.check_predicted_speedup, _predict("nearest"), "nearest measured size"),
    # the likely mistake against the clock: the GPU's assumption, v(n) = 1 and drafts for free, on a CPU
    (grading.check_predicted_speedup, (_predict(), {n: 1.0 for n in range(1, 6)}, 0.0), "too high"),
    (grading.check_draft_vocab_token, _token("renormalised"), "renormalised over the draft vocabulary"),
    (grading.check_draft_vocab_token, _token("zeros"), "a q with mass outside"),
    (grading.check_sampled_run, _run("unseeded"), "same seed"),
    (grading.check_sampled_run, _run("greedy"), "temperature"),
    (grading.check_sampled_run, _run("accepted"), "accepted drafts per pass"),
    (grading.check_sampled_run, _run("alpha"), "is α"),
]

RIGHT = [
    (grading.check_compute_bound, (_bound(), _measure_v())),
    (grading.check_predicted_speedup, _predict()),
    (grading.check_draft_vocab_token, _token()),
    (grading.check_sampled_run, _run()),
]


test_graders = grader_tests(WRONG, RIGHT)
