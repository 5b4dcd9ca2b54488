"""The models the two-model benchmark runs, built with random weights (nothing is downloaded).

    resnet18, resnet50,   torchvision CNNs, input batch x 3 x 224 x 224
    resnet152, convnext_tiny
    vit_b_16              torchvision Vision Transformer (attention inside nn.MultiheadAttention,
                          a non-leaf module whose own forward launches most of the block's kernels)
    encoder               nn.TransformerEncoder, 6 layers, d_model 512, 8 heads, batch x 128 tokens
    gpt2                  Hugging Face's GPT-2 small (transformers installed), batch x `tokens` tokens
"""
import argparse
import time

MODELS = ("resnet18", "resnet50", "resnet152", "convnext_tiny", "vit_b_16", "encoder", "gpt2")
GPT2_TOKENS = 256                # the positions the model has, and a batch job's sequence


def build(name, batch, device="cuda", tokens=GPT2_TOKENS):
    import torch
    if name == "gpt2":                   # Hugging Face's GPT-2 small, random weights (nothing downloaded)
        from transformers import GPT2Config, GPT2LMHeadModel
        model = GPT2LMHeadModel(GPT2Config(n_positions=GPT2_TOKENS))
        x = torch.randint(0, model.config.vocab_size, (batch, tokens), device=device)
    elif name == "encoder":
        layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)
        x = torch.randn(batch, 128, 512, device=device)
    else:
        import torchvision
        model = getattr(torchvision.models, name)(weights=None)
        x = torch.randn(batch, 3, 224, 224, device=device)
    return model.to(device).eval(), x


def job_spec(text, modes=("",)):
    """(model, batch, train) from MODEL:BATCH, or with "train" among `modes` MODEL:BATCH:train
    (argparse's type for the workloads' job options)."""
    name, _, rest = text.partition(":")
    batch, _, mode = rest.partition(":")
    want = " or ".join(f"MODEL:BATCH{':' + m if m else ''}" for m in modes)
    if name not in MODELS or not batch.isdigit() or int(batch) < 1 or mode not in modes:
        raise argparse.ArgumentTypeError(f"{text!r}: want {want}, MODEL one of {', '.join(MODELS)}, BATCH >= 1")
    return name, int(batch), mode == "train"


def wait_for_start():
    """Say READY once warm, then wait for the common start time (CLOCK_MONOTONIC, system-wide) on
    stdin, so that every program of a run measures over the same interval. No stdin (< /dev/null,
    a closed pipe): start now."""
    print("READY", flush=True)
    try:
        start_at = float(input())
    except (EOFError, ValueError):
        return time.monotonic()
    while time.monotonic() < start_at:
        time.sleep(0.0005)
    return start_at
