#!/usr/bin/env python3
"""Make the tiny random Hugging Face models and reference logits under fixtures/arch/.

Each model is a randomly initialised transformers checkpoint (seed fixed) of one architecture
ferrite supports: llama (plain, and with Llama 3 rope scaling), mistral (sliding window shorter
than the prompts), qwen2 (q/k/v biases), qwen3 (q/k norms, head_dim != hidden/heads), qwen3moe
and mixtral (mixture of experts, top-2), gemma2 (attention and final logit soft-capping,
alternating sliding/global layers), gemma3 (Gemma3ForCausalLM with linear rope scaling on
its global layers), phi3 (fused projections; LongRoPE: short factors within the original
context, long past it) and qwen2yarn (YaRN rope scaling with its attention factor). Weights are drawn with a larger spread than the
transformers default so the logits are far from uniform: a top-1 that wins by a wide margin
survives f16 and Q8_0 rounding, so the tests can demand top-1 agreement.

Outputs per model, in fixtures/arch/<name>/:
  config.json, model.safetensors (float32; the `mistral` model is stored in bfloat16 and its
  reference logits are computed from exactly those bf16 values), tokenizer.json and
  tokenizer_config.json (one byte-level BPE trained here on fixtures/reference/GPL-3.txt,
  shared by all models, with a ChatML chat template), generation_config.json,
  logits-<name>.jsonl (the logits fixture schema of fixtures/reference/README.md), and
  logits-<name>.f32: the raw float32 logits (little-endian) of every scored step, full
  vocabulary, in line order then step order, for a max |delta logit| check.

Run (needs torch, transformers, safetensors, tokenizers, numpy):
  python3 scripts/make_arch_fixtures.py [OUT_DIR] [--seed N] [--alt-shapes]   # default fixtures/arch
A different seed gives a held-out set of the same kinds (run the tests on it with
FERRITE_ARCH_FIXTURES=OUT_DIR).
"""

import argparse
import copy
import json
import math
import pathlib

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = pathlib.Path(__file__).resolve().parent.parent
N_GEN = 32
TOP_K = 20
MIN_MARGIN = 0.02
# Spread of the hidden matrices (times 1/sqrt(fan_in)). Larger gains make random networks
# chaotic: 1.5 let Q8_0 rounding of the weights alone flip up to 9% of the top-1s.
HIDDEN_GAIN = 0.8
SEED = 20261129
VOCAB = 512
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    bos_token_id=None,
    eos_token_id=2,
    pad_token_id=0,
)

# The expert layout DeepSeek and GLM share: one leading dense layer, then 8 experts of
# width 32, top-2.
DEEPSEEK_MOE = dict(
    num_hidden_layers=3,
    first_k_dense_replace=1,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
)
# DeepSeek's multi-head latent attention: a 32-wide KV latent, 8 rope and 16 plain values
# per query/key head, 16 per value head.
MLA = dict(
    num_key_value_heads=4,
    kv_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=16,
)

# name -> (config class name, extra config, tie embeddings, storage dtype)
MODELS = {
    "llama": ("LlamaConfig", dict(num_hidden_layers=3, intermediate_size=96, rope_theta=10000.0), False, torch.float32),
    "llama3": (
        "LlamaConfig",
        dict(
            rope_theta=500000.0,
            # original context 48 tokens: every frequency with a wavelength over 12 positions
            # is slowed down (by up to 8x), so the scaling changes logits from position 1 on.
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=48,
            ),
        ),
        True,
        torch.float32,
    ),
    "mistral": (
        "MistralConfig",
        dict(sliding_window=8, rope_theta=10000.0, head_dim=16),
        False,
        torch.bfloat16,
    ),
    "qwen2": ("Qwen2Config", dict(rope_theta=1000000.0, use_sliding_window=False), True, torch.float32),
    "qwen3": (
        "Qwen3Config",
        dict(head_dim=32, rope_theta=1000000.0, use_sliding_window=False, attention_bias=False),
        True,
        torch.float32,
    ),
    "qwen3moe": (
        "Qwen3MoeConfig",
        dict(
            head_dim=16,
            rope_theta=1000000.0,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            use_sliding_window=False,
            output_router_logits=False,
        ),
        False,
        torch.float32,
    ),
    "mixtral": (
        "MixtralConfig",
        dict(
            num_local_experts=4,
            num_experts_per_tok=2,
            intermediate_size=32,
            rope_theta=1000000.0,
            sliding_window=None,
            output_router_logits=False,
        ),
        False,
        torch.float32,
    ),
    "gemma2": (
        "Gemma2Config",
        dict(
            num_hidden_layers=3,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=8,
            # Caps near the random network's score and logit spreads (~±40 logits), so both
            # change the logits; a lower final cap compresses the top of the distribution
            # into near-ties.
            attn_logit_softcapping=20.0,
            final_logit_softcapping=50.0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            hidden_activation="gelu_pytorch_tanh",
        ),
        False,
        torch.float32,
    ),
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            num_hidden_layers=3,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            rope_scaling=dict(rope_type="linear", factor=8.0),
            hidden_activation="gelu_pytorch_tanh",
        ),
        True,
        torch.float32,
    ),
    "qwen2yarn": (
        "Qwen2Config",
        dict(
            rope_theta=10000.0,
            use_sliding_window=False,
            # YaRN by 4 from an original context of 32: every prompt runs past it, and the
            # ramp between the corrected dimensions falls inside the 8 rotated pairs.
            rope_scaling=dict(
                rope_type="yarn",
                factor=4.0,
                original_max_position_embeddings=32,
                beta_fast=32.0,
                beta_slow=1.0,
            ),
        ),
        False,
        torch.float32,
    ),
    "phi3": (
        "Phi3Config",
        dict(
            num_hidden_layers=3,
            # Original context 64: the three short prompts and their continuations stay
            # inside it (short factors), the long one is past it from its first step (long
            # factors), so both factor sets are checked.
            original_max_position_embeddings=64,
            rope_theta=10000.0,
            rope_scaling=dict(
                type="longrope",
                short_factor=[1.0 + 0.1 * i for i in range(8)],
                long_factor=[1.5 + 0.3 * i for i in range(8)],
            ),
            sliding_window=None,
            pad_token_id=0,
        ),
        False,
        torch.float32,
    ),
    "glm4moe": (
        "Glm4MoeConfig",
        dict(
            **DEEPSEEK_MOE,
            head_dim=16,
            rope_theta=10000.0,
            # Half of each head rotated (GLM-4.5's 0.5): the other half passes through.
            partial_rotary_factor=0.5,
            use_qk_norm=True,
            attention_bias=True,
            n_shared_experts=1,
            n_group=1,
            topk_group=1,
            norm_topk_prob=True,
            routed_scaling_factor=1.5,
        ),
        False,
        torch.float32,
    ),
    "deepseek2": (
        # DeepSeek-V2-Lite's kind: no q LoRA, softmax routing without groups, two shared
        # experts, weights not renormalised.
        "DeepseekV2Config",
        dict(
            **DEEPSEEK_MOE,
            **MLA,
            q_lora_rank=None,
            n_shared_experts=2,
            topk_method="greedy",
            norm_topk_prob=False,
            routed_scaling_factor=1.0,
            rope_theta=10000.0,
        ),
        False,
        torch.float32,
    ),
    "deepseek3": (
        # DeepSeek-V3's kind: q LoRA, sigmoid routing with selection bias over 2 groups (1
        # kept), routed scale 2.5, YaRN with its mscale on the attention scale.
        "DeepseekV3Config",
        dict(
            **DEEPSEEK_MOE,
            **MLA,
            q_lora_rank=48,
            n_shared_experts=1,
            n_group=2,
            topk_group=1,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            rope_theta=10000.0,
            rope_scaling=dict(
                rope_type="yarn",
                factor=4.0,
                original_max_position_embeddings=32,
                beta_fast=32.0,
                beta_slow=1.0,
                mscale=1.0,
                mscale_all_dim=1.0,
            ),
        ),
        False,
        torch.float32,
    ),
    "gpt-oss": (
        # gpt-oss's kind: attention sinks, sliding (window 8) and full layers alternating,
        # q/k/v/o biases, 4 experts of width 32 with biases and the clamped SwiGLU, router
        # bias, YaRN without rounding its ramp (`truncate = false`, as gpt-oss ships it)
        # with the ramp inside the 8 pairs of a 16-value head.
        "GptOssConfig",
        dict(
            num_hidden_layers=3,
            head_dim=16,
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            attention_bias=True,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=150000.0,
                factor=4.0,
                original_max_position_embeddings=32,
                beta_fast=32.0,
                beta_slow=1.0,
                truncate=False,
            ),
        ),
        False,
        torch.float32,
    ),
}

# --alt-shapes: other widths, head counts (GQA group 3), depths and expert counts, for a
# held-out set that exercises shapes the committed fixtures do not.
ALT_COMMON = dict(hidden_size=96, intermediate_size=160, num_hidden_layers=3, num_attention_heads=6)
ALT_EXTRA = {
    "qwen3": dict(head_dim=32),
    "qwen3moe": dict(num_experts=6, moe_intermediate_size=64),
    "mixtral": dict(num_local_experts=8, intermediate_size=64),
    "llama": dict(num_hidden_layers=2, intermediate_size=128),
}

PROMPTS = [
    ("plain", "The licenses for most software are designed to take away your freedom"),
    ("plain", "1, 2, 3, 4, 5, 6, 7,"),
    ("chat_template", [{"role": "user", "content": "Can you share and change it?"}]),
    (
        "plain",
        "When we speak of free software, we are referring to freedom, not price. Our General "
        "Public Licenses are designed to make sure that you have the freedom to distribute "
        "copies of free software (and charge for them if you wish), that you receive source "
        "code or can get it if you want it, that you can change the software or use pieces of "
        "it in new free programs, and that you know you can do these things.",
    ),
]


def train_tokenizer(out: pathlib.Path) -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE of VOCAB tokens (GPT-2 regex, specials first: ids 0, 1, 2)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = (ROOT / "fixtures/reference/GPL-3.txt").read_text(encoding="utf-8")
    tok.train_from_iterator(text.split("\n\n"), trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(out / "tokenizer.json"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def init_weights(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Weights with unit-scale activations; norms and biases away from their neutral values."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name or "lm_head" in name:
                # Unit-scale output rows give logits with a spread of ~sqrt(hidden): clear
                # top-1 margins.
                p.copy_(torch.randn(p.shape, generator=gen))
            elif p.dim() >= 2:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) * (HIDDEN_GAIN / math.sqrt(fan_in)))
            else:
                p.copy_(torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            # The routers' selection bias (DeepSeek V3, GLM-4.5) is a buffer, zero at init:
            # drawn small so it changes which experts win without making a biased score
            # negative (transformers fills masked groups with 0, not minus infinity).
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))


def make_model(name: str, spec, attempt: int, drop=None, seed: int = SEED) -> torch.nn.Module:
    """The model `name`, weights drawn with seed number `attempt`; `drop` names a config key
    reset to None (the feature turned off)."""
    cls_name, extra, tie, dtype = spec
    args = {**COMMON, **extra, "tie_word_embeddings": tie}
    if drop is not None:
        args[drop] = None
    cfg = getattr(transformers, cls_name)(**args)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
    gen = torch.Generator().manual_seed(seed + sum(map(ord, name)) + 1000 * attempt)
    init_weights(model, gen)
    if dtype != torch.float32:
        # The reference runs on exactly the stored (rounded) values. Only the parameters are
        # rounded: `model.to(dtype)` would also round buffers such as rope's inv_freq, which
        # a loader recomputes in float32.
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(dtype).to(torch.float32))
    return model.eval()


def q8_0_round(w: torch.Tensor) -> torch.Tensor:
    """`w` rounded as GGML Q8_0 stores it: blocks of 32, int8 values, f16 scale max/127."""
    x = w.reshape(-1, 32)
    d = (x.abs().max(dim=1, keepdim=True).values / 127).half().float()
    q = torch.where(d > 0, (x / d).round().clamp(-127, 127), torch.zeros_like(x))
    return (q * d).reshape(w.shape)


@torch.no_grad()
def q8_0_keeps_top1(model, lines) -> bool:
    """Whether every recorded greedy token stays the argmax with Q8_0-rounded matrices."""
    q = copy.deepcopy(model)
    for name, p in q.named_parameters():
        # Routers (`mlp.gate`, `block_sparse_moe.gate`) stay float: llama.cpp's quantize and
        # ferrite's keep `ffn_gate_inp` unquantized.
        if name.endswith((".gate.weight", ".router.weight")):
            continue
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            # gpt-oss stores experts input-major ([E, in, out]); a GGUF row is one output.
            if p.shape[-2] % 32 == 0:
                p.copy_(q8_0_round(p.transpose(-1, -2)).transpose(-1, -2))
        elif p.dim() >= 2 and p.shape[-1] % 32 == 0:
            p.copy_(q8_0_round(p))
    for line in lines:
        ids = line["prompt_ids"] + line["generated_ids"]
        n = len(line["prompt_ids"])
        top = logits_of(q, ids)[n - 1 : n - 1 + N_GEN].argmax(dim=-1).tolist()
        if top != line["generated_ids"]:
            return False
    return True


@torch.no_grad()
def logits_of(model, ids):
    return model(torch.tensor([ids])).logits[0].to(torch.float32)


# Features whose effect the fixture must show: turning each off changes the recorded logits.
FEATURE_KEYS = {
    "llama3": ["rope_scaling"],
    "mistral": ["sliding_window"],
    "gemma2": ["attn_logit_softcapping", "final_logit_softcapping"],
    "gemma3": ["rope_scaling"],
    "phi3": ["rope_scaling"],
    "qwen2yarn": ["rope_scaling"],
    "deepseek3": ["rope_scaling"],
}


def check_feature_matters(name: str, spec, attempt: int, seed: int, model, ids) -> None:
    for key in FEATURE_KEYS.get(name, []):
        plain = make_model(name, spec, attempt, drop=key, seed=seed)
        delta = float((logits_of(model, ids) - logits_of(plain, ids)).abs().max())
        print(f"{name}: max |delta logit| without {key} = {delta:.3f}")
        assert delta > 0.5, f"{name}: {key} does not change the logits"


def record(model, tok, name: str):
    """The fixture lines of `model` and the raw logits of every scored step."""
    lines, raw = [], []
    for i, (kind, prompt) in enumerate(PROMPTS):
        line = {"id": f"arch-{name}-{i:03d}", "kind": kind}
        if kind == "chat_template":
            line["messages"] = prompt
            prompt = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        prompt_ids = tok.encode(prompt, add_special_tokens=True)
        line["prompt"] = prompt
        line["prompt_ids"] = prompt_ids
        ids = list(prompt_ids)
        for _ in range(N_GEN):
            last = logits_of(model, ids)[-1]
            # argmax, ties to the lowest id
            ids.append(int(torch.nonzero(last == last.max())[0]))
        gen_ids = ids[len(prompt_ids):]
        full = logits_of(model, ids)[len(prompt_ids) - 1 : len(prompt_ids) - 1 + N_GEN]
        logp = torch.log_softmax(full, dim=-1)
        steps, consistent, margin = [], True, math.inf
        for s in range(N_GEN):
            top = torch.topk(logp[s], TOP_K)
            pairs = [[int(t), round(float(v), 6)] for v, t in zip(top.values, top.indices)]
            steps.append({"token": gen_ids[s], "logprob": round(float(logp[s][gen_ids[s]]), 6), "top": pairs})
            consistent &= int(torch.argmax(full[s])) == gen_ids[s]
            margin = min(margin, float(top.values[0] - top.values[1]))
        eos = [j for j, t in enumerate(gen_ids) if t in (0, 2)]
        line.update(
            generated_ids=gen_ids,
            generated_text=tok.decode(gen_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False),
            steps=steps,
            eos_index=eos[0] if eos else None,
            argmax_consistent=consistent,
            min_top1_margin=round(margin, 6),
        )
        lines.append(line)
        raw.append(full.numpy().astype("<f4"))
    return lines, raw


def write(out: pathlib.Path, name: str, lines, raw) -> None:
    with open(out / f"logits-{name}.jsonl", "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=True) + "\n")
    np.concatenate(raw).tofile(out / f"logits-{name}.f32")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", type=pathlib.Path, default=ROOT / "fixtures/arch")
    ap.add_argument("--seed", type=int, default=SEED, help="another seed makes a held-out set")
    ap.add_argument("--alt-shapes", action="store_true", help="held-out shapes (ALT_COMMON)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="make only these models")
    args = ap.parse_args()
    out_root, seed = args.out, args.seed
    models = {n: s for n, s in MODELS.items() if not args.only or n in args.only}
    if args.alt_shapes:
        COMMON.update(ALT_COMMON)
        models = {
            n: (cls, {**extra, **ALT_EXTRA.get(n, {})}, tie, dt)
            for n, (cls, extra, tie, dt) in models.items()
        }
    torch.set_num_threads(1)
    tok_dir = out_root / ".tokenizer"
    tok = train_tokenizer(tok_dir)
    for name, spec in models.items():
        out = out_root / name
        out.mkdir(parents=True, exist_ok=True)
        # Redraw the weights until no greedy step is a near-tie (margin under MIN_MARGIN) and
        # Q8_0 rounding of the weights keeps every top-1: otherwise a top-1 check on a
        # quantized model would measure the random network's chaos, not the engine.
        for attempt in range(200):
            model = make_model(name, spec, attempt, seed=seed)
            lines, raw = record(model, tok, name)
            margin = min(line["min_top1_margin"] for line in lines)
            consistent = all(line["argmax_consistent"] for line in lines)
            if margin >= MIN_MARGIN and consistent and q8_0_keeps_top1(model, lines):
                break
        else:
            raise SystemExit(f"{name}: no draw without near-ties (last: margin {margin}, consistent {consistent})")
        model.save_pretrained(out, safe_serialization=True)
        if spec[3] != torch.float32:
            # save_pretrained writes float32; store the rounded weights in their own dtype.
            from safetensors.torch import load_file, save_file

            st = out / "model.safetensors"
            tensors = {k: v.to(spec[3]) for k, v in load_file(st).items()}
            save_file(tensors, st, metadata={"format": "pt"})
            cfg = json.loads((out / "config.json").read_text())
            cfg["dtype"] = "bfloat16"
            (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        tok.save_pretrained(out)
        # transformers 5 keeps the template in chat_template.jinja; older readers look in
        # tokenizer_config.json, so it is in both (same text).
        tc_path = out / "tokenizer_config.json"
        tc = json.loads(tc_path.read_text())
        tc["chat_template"] = CHAT_TEMPLATE
        tc_path.write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")
        write(out, name, lines, raw)
        check_feature_matters(name, spec, attempt, seed, model, tok.encode(PROMPTS[-1][1]))
        n_params = sum(p.numel() for p in model.parameters())
        print(f"{name}: {n_params} parameters, draw {attempt}, min top-1 margin {margin}")
    for p in tok_dir.iterdir():
        p.unlink()
    tok_dir.rmdir()


if __name__ == "__main__":
    main()
