#!/usr/bin/env python3
"""Check a model directory exported by roll against HuggingFace transformers.

roll's `export_hf_dir` writes a trained model back as the HF directory it was loaded from. This
script loads such a directory with transformers (`AutoModelForCausalLM`, `AutoTokenizer`) and
compares, prompt by prompt, with what roll computed on the same model:

- the token ids of each prompt (transformers' tokenizer from the exported tokenizer files vs
  roll's),
- the per-token log-probs `log p(ids[t+1] | ids[..=t])` (max absolute difference),
- the greedy continuation (argmax decoding with transformers' forward, EOS not treated as a
  stop, vs roll's).

Input (written by the ignored Rust test `write_transformers_roundtrip_reference`):

    cargo test -p roll-backend-burn --test hf_export_tests -- --ignored write_transformers
    # -> target/hf_roundtrip/model/           the exported directory
    #    target/hf_roundtrip/reference.json   {"model_dir": "model", "cases": [{"prompt",
    #                                          "input_ids", "token_logprobs", "greedy_tokens"}]}
    python3 tools/hf_roundtrip.py target/hf_roundtrip/reference.json

The reference also holds `lora`: LoRA adapters after one step, exported in PEFT's layout
(`adapter/`), and roll's log-probs of the adapted policy; the script loads them with
`PeftModel.from_pretrained(base, adapter)` and compares (skipped if `lora` is absent).

(`ROLL_HF_ROUNDTRIP_DIR=/some/dir` writes elsewhere.) Needs `torch`, `transformers`,
`safetensors` and `peft` (`pip install torch transformers safetensors peft`). Exits 1 if the token ids or the
greedy tokens differ or a log-prob differs by more than `--tol` (default 1e-4).
"""

import argparse
import json
import math
import os
import sys


def greedy(model, ids, n):
    """`n` argmax tokens after `ids`, EOS not treated as a stop (as roll's reference decoding)."""
    import torch

    ids = list(ids)
    start = len(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
    return ids[start:]


def check_peft(reference, reference_path, tol):
    """LoRA adapters exported by roll, loaded with PEFT on the base model: log-probs vs roll's."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    lora = reference["lora"]
    adapter_dir = os.path.join(os.path.dirname(os.path.abspath(reference_path)), lora["adapter_dir"])
    base = AutoModelForCausalLM.from_pretrained(lora["base_dir"], dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter_dir)
    model.eval()
    worst = 0.0
    for case in lora["cases"]:
        ids = case["input_ids"]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        hf_lp = [logp[t, ids[t + 1]].item() for t in range(len(ids) - 1)]
        if len(hf_lp) != len(case["token_logprobs"]):
            worst = math.inf
            continue
        worst = max([worst] + [abs(a - b) for a, b in zip(hf_lp, case["token_logprobs"])])
    print(f"PEFT adapter on the base: max |log-prob diff| vs roll's LoRA policy: {worst:.3e}")
    return worst <= tol


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reference", help="reference.json written by the Rust side")
    parser.add_argument("--tol", type=float, default=1e-4, help="max log-prob difference")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with open(args.reference) as f:
        reference = json.load(f)
    model_dir = os.path.join(os.path.dirname(os.path.abspath(args.reference)), reference["model_dir"])
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    print(f"loaded {model_dir}: {type(model).__name__}, eos {model.generation_config.eos_token_id}")

    ok = True
    worst = 0.0
    for i, case in enumerate(reference["cases"]):
        ids = case["input_ids"]
        hf_ids = tok(case["prompt"], add_special_tokens=False)["input_ids"]
        same_ids = hf_ids == ids
        ok &= same_ids
        x = torch.tensor([ids])
        with torch.no_grad():
            logits = model(x).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        hf_lp = [logp[t, ids[t + 1]].item() for t in range(len(ids) - 1)]
        diff = max((abs(a - b) for a, b in zip(hf_lp, case["token_logprobs"])), default=0.0)
        if len(hf_lp) != len(case["token_logprobs"]) or math.isnan(diff):
            diff = math.inf
        worst = max(worst, diff)
        ok &= diff <= args.tol
        hf_greedy = greedy(model, ids, len(case["greedy_tokens"]))
        same_greedy = hf_greedy == case["greedy_tokens"]
        ok &= same_greedy
        print(f"case {i}: {case['prompt']!r}")
        print(f"  token ids equal: {same_ids}" + ("" if same_ids else f" (hf {hf_ids}, roll {ids})"))
        print(f"  max |log-prob diff| over {len(hf_lp)} tokens: {diff:.3e}")
        print(f"  greedy tokens equal: {same_greedy}  hf {hf_greedy}  roll {case['greedy_tokens']}")
        print(f"  hf greedy text: {tok.decode(hf_greedy)!r}")
    print(f"max |log-prob diff| over all cases: {worst:.3e} (tolerance {args.tol:g})")
    if "lora" in reference:
        ok &= check_peft(reference, args.reference, args.tol)
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
