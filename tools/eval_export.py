#!/usr/bin/env python3
"""Greedy held-out accuracy of a model exported by roll, computed by HuggingFace transformers.

A run directory holds `eval_prompts.jsonl` (`prompt`, `answer`) and the exported HF directories
(`sft_model/`, `final_model/`). This loads one with `AutoModelForCausalLM` and `AutoTokenizer`,
answers every prompt greedily (the plain prompt, no chat template, as the main job's
`model.prompt_format = "plain"`), and counts an answer right when its stripped text equals the
ground truth — the main job's `math_rule` with `answer = "whole"` on integer answers. The figure
should equal the run's own `after SFT` / `after RL` accuracy.

    python3 tools/eval_export.py output/rlvr_arithmetic final_model [--max-new-tokens 6]

Needs `torch` and `transformers`.
"""
import argparse
import json
import pathlib

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir", type=pathlib.Path)
    ap.add_argument("model", help="the exported directory inside run_dir, e.g. final_model")
    ap.add_argument("--max-new-tokens", type=int, default=6)
    args = ap.parse_args()
    model_dir = args.run_dir / args.model
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    rows = [json.loads(l) for l in (args.run_dir / "eval_prompts.jsonl").read_text().splitlines()]
    right = 0
    with torch.no_grad():
        for row in rows:
            ids = tok(row["prompt"], return_tensors="pt", add_special_tokens=False).input_ids
            out = model.generate(
                ids,
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos if isinstance(eos, int) else eos[0],
            )
            text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
            right += text.strip() == str(row["answer"]).strip()
    print(f"{model_dir}: {right}/{len(rows)} = {100 * right / len(rows):.1f}% greedy accuracy (transformers)")


if __name__ == "__main__":
    main()
