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
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from benchlib import open_loop  # noqa: E402  (the benchmarks' one arrival loop)
from models import GPT2_TOKENS, MODELS, build, wait_for_start  # noqa: E402

PROMPT_TOKENS = 32               # --decode-tokens: the prompt's length unless --prompt-tokens says


def forward_pass(model, x):
    """A request: one forward pass, its result on the CPU side."""
    import torch
    model(x)
    torch.cuda.current_stream().synchronize()


def generation(tokens):
    """A request: `tokens` new tokens after the prompt `x`, one model call each (KV cache), each
    token on the CPU before the next call (a streaming service sends it)."""
    def generate(model, x):
        out = model(input_ids=x, use_cache=True)
        for i in range(tokens):
            token = out.logits[:, -1:].argmax(-1)
            token.cpu()
            if i + 1 < tokens:
                out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
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


def serve(model, x, rate, seconds, warmup_s, start_at, request=forward_pass):
    """Open-loop arrivals from start_at; latencies of the requests after warmup_s."""
    import torch
    with torch.no_grad():
        return open_loop(rate, seconds, lambda: request(model, x), warmup_s, t0=start_at)


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
    add_service_options(p)
    args = p.parse_args()
    problem = check_service(args.model, args.batch, args.decode_tokens, args.prompt_tokens)
    if problem:
        p.error(problem)
    model, x, request = build_service(args.model, args.batch, args.decode_tokens, args.prompt_tokens)
    warm(model, x, request=request)
    start_at = wait_for_start()
    lat = serve(model, x, args.rate, args.seconds, args.warmup_s, start_at, request)
    print(json.dumps({"hp_latencies_s": lat}), flush=True)


if __name__ == "__main__":
    main()
