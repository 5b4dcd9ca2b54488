#!/usr/bin/env python3
"""A latency-critical inference service, as an ordinary PyTorch program (no scheduler imports):
requests arrive open-loop at --rate per second; a request's latency runs from its scheduled
arrival to its result being on the CPU side (synchronize). Prints one JSON line of latencies.

    python serve.py --model resnet18 --batch 4 --rate 20 --seconds 26
    python serve.py --model gpt2 --batch 1 --decode-tokens 8 --rate 5 --seconds 101

With --decode-tokens N (GPT-2) a request is a text generation, as a streaming LLM service runs it:
the prompt's forward pass, then N - 1 forward passes of one token each with the KV cache, greedy,
each new token copied to the CPU (sent to the user) before the next pass begins. So a request is
N model calls with short CPU gaps between them, each waiting for its token.

With --between-requests MODEL:BATCH[:train] the service's own process runs that batch job's
iterations between its requests, each synchronized and begun only if it should end before the next
arrival: the service alone as perfect preemption of that job would leave it (the GPU's caches and
clocks as the job left them, none of its work in the way).

    python serve.py --model resnet18 --batch 4 --between-requests resnet50:64
"""
import argparse
import collections
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from benchlib import gc_pauses_if_asked, open_loop  # noqa: E402  (the benchmarks' one arrival loop)
from models import GPT2_TOKENS, MODELS, build, job_spec, wait_for_start  # noqa: E402
from batch import make_step  # noqa: E402

PROMPT_TOKENS = 32               # --decode-tokens: the prompt's length unless --prompt-tokens says


def forward_pass(model, x, gpu_waits=None):
    """A request: one forward pass, its result on the CPU side. `gpu_waits`, if a list, gets how
    long the result took after the last launch returned: the GPU's part of the latency that the
    launching did not hide (its own work still queued, or another program's ahead of it)."""
    import torch
    model(x)
    launched = time.monotonic()
    torch.cuda.current_stream().synchronize()
    if gpu_waits is not None:
        gpu_waits.append(time.monotonic() - launched)


def generation(tokens):
    """A request: `tokens` new tokens after the prompt `x`, one model call each (KV cache), each
    token on the CPU before the next call (a streaming service sends it)."""
    def generate(model, x, gpu_waits=None):
        out = model(input_ids=x, use_cache=True)
        for i in range(tokens):
            token = out.logits[:, -1:].argmax(-1)
            launched = time.monotonic()
            token.cpu()
            if i + 1 < tokens:
                out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
            elif gpu_waits is not None:            # (as forward_pass: the last token's wait)
                gpu_waits.append(time.monotonic() - launched)
    return generate


def build_service(name, batch, decode_tokens=0, prompt_tokens=None):
    """(model, input, request): a forward pass a request, or with `decode_tokens` a generation.
    Arguments as `check_service` passed them."""
    if not decode_tokens:
        return (*build(name, batch), forward_pass)
    return (*build(name, batch, tokens=_prompt(prompt_tokens)), generation(decode_tokens))


def _prompt(prompt_tokens):
    return PROMPT_TOKENS if prompt_tokens is None else prompt_tokens


def add_service_options(p):
    p.add_argument("--decode-tokens", type=int, default=0, metavar="N",
                   help="gpt2: a request generates N tokens (0: a request is one forward pass)")
    p.add_argument("--prompt-tokens", type=int, metavar="N",
                   help=f"with --decode-tokens: the prompt's length (default {PROMPT_TOKENS})")


def check_service(name, batch, decode_tokens, prompt_tokens):
    """Why these service options cannot run, or None (before any model is built)."""
    if batch < 1:
        return f"--batch must be at least 1, got {batch}"
    if prompt_tokens is not None and not decode_tokens:
        return "--prompt-tokens goes with --decode-tokens"
    if not decode_tokens:
        return None
    prompt = _prompt(prompt_tokens)
    if name != "gpt2":
        return "--decode-tokens needs the gpt2 model"
    if decode_tokens < 1 or prompt < 1 or prompt + decode_tokens > GPT2_TOKENS:
        return (f"--decode-tokens and --prompt-tokens must be at least 1 and add up to at most {GPT2_TOKENS} "
                f"(got {decode_tokens} and {prompt})")
    return None


def serve(model, x, rate, seconds, warmup_s, start_at, request=forward_pass, between=None):
    """Open-loop arrivals from start_at: the latencies of the requests after warmup_s, how late
    each began (benchlib.open_loop) and how long it waited for the GPU after its last launch, as the
    service's part of the output. A latency is then: the late start, the launching, that wait."""
    import torch
    wake_late, gpu_waits = [], []
    with torch.no_grad():
        latencies = open_loop(rate, seconds, lambda: request(model, x, gpu_waits), warmup_s, t0=start_at,
                              between=between, wake_late=wake_late)
    return {"hp_latencies_s": latencies, "hp_wake_late_s": wake_late,
            "hp_gpu_wait_s": gpu_waits[len(gpu_waits) - len(latencies):]}    # the warm-up's left out


class GapWork:
    """A batch job's iterations in the gaps between requests, none begun unless it should end before
    the next arrival: by MARGIN times the median of the latest few, plus MARGIN_S. (Not their slowest:
    one slow iteration would then stop the work for good, since only iterations that run renew it.)"""
    MARGIN, MARGIN_S, RECENT = 1.25, 0.001, 8

    def __init__(self, step, clock=time.monotonic):
        self.step, self.clock = step, clock
        self.recent = collections.deque(maxlen=self.RECENT)
        self.iterations = 0
        self.late = 0              # iterations that still ran at the next arrival (that request was not alone)
        for _ in range(3):         # a first estimate
            self._timed_step()

    def _timed_step(self):
        t = self.clock()
        self.step()
        end = self.clock()
        self.recent.append(end - t)
        return end

    def __call__(self, next_arrival):
        while self.clock() + self.MARGIN * statistics.median(self.recent) + self.MARGIN_S < next_arrival:
            self.iterations += 1
            self.late += self._timed_step() > next_arrival

    def report(self):
        return {"gap_iterations": self.iterations, "gap_late": self.late}


GAP_JOB_MODES = ("", "train")                    # --between-requests MODEL:BATCH[:train] (models.job_spec)


def check_gap_work(spec):
    """Why --between-requests cannot run, or None."""
    if spec is None:
        return None
    try:
        job_spec(spec, GAP_JOB_MODES)
    except argparse.ArgumentTypeError:
        return f"--between-requests wants MODEL:BATCH[:train] with MODEL one of {', '.join(MODELS)}, got {spec!r}"
    return None


def gap_work(spec):
    """GapWork from --between-requests MODEL:BATCH[:train] (warmed)."""
    import torch
    name, batch, train = job_spec(spec, GAP_JOB_MODES)
    with torch.set_grad_enabled(train):          # serve() runs under no_grad; a training step needs autograd
        model, x = build(name, batch)
        step = make_step(model, x, train)

    def step_with_grad():
        with torch.set_grad_enabled(train):
            step()
    return GapWork(step_with_grad)


def warm(model, x, iterations=20, request=forward_pass):
    import torch
    with torch.no_grad():
        for _ in range(iterations):
            request(model, x)
    torch.cuda.synchronize()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="resnet18")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--seconds", type=float, default=26.0)
    p.add_argument("--warmup-s", type=float, default=1.0)
    p.add_argument("--between-requests", metavar="MODEL:BATCH[:train]",
                   help="run this batch job's iterations between requests, each ended before the next arrival")
    add_service_options(p)
    args = p.parse_args()
    problem = check_service(args.model, args.batch, args.decode_tokens, args.prompt_tokens) or \
        check_gap_work(args.between_requests)
    if problem:
        p.error(problem)
    gc_pauses = gc_pauses_if_asked()          # from before the build, as pair_threads.py records
    model, x, request = build_service(args.model, args.batch, args.decode_tokens, args.prompt_tokens)
    warm(model, x, request=request)
    between = gap_work(args.between_requests) if args.between_requests else None
    start_at = wait_for_start()
    served = serve(model, x, args.rate, args.seconds, args.warmup_s, start_at, request, between)
    if gc_pauses:
        served["hp_gc_pauses"] = gc_pauses.since(start_at)
    print(json.dumps({**served, **(between.report() if between else {})}), flush=True)


if __name__ == "__main__":
    main()
