"""Writes a random Qwen3-MoE as a HuggingFace directory, for measuring expert parallelism on a
model bigger than the tests' (docs/distributed.md, "Measured here").

    python3 tools/random_qwen3_moe.py OUT_DIR [TOKENIZER_DIR]

Needs torch and transformers. The tokenizer files (default: the tiny fixture's, vocabulary 512)
are copied beside the weights. The model: 4 layers, hidden 256, 4 query and 2 key/value heads
of 64, every layer a mixture of 8 experts of 512 units, 2 per token, tied embeddings — 13.5M
parameters, 54 MB of f32, drawn as transformers initialises them (seed 17).
"""

import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

EXPERTS = 8


def main() -> None:
    out = Path(sys.argv[1])
    tokenizer = Path(sys.argv[2]) if len(sys.argv) > 2 else (
        Path(__file__).resolve().parents[1] / ".." / "shared" / "fixtures" / "tiny-qwen2-sft"
    )
    torch.manual_seed(17)
    config = Qwen3MoeConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_experts=EXPERTS,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        tie_word_embeddings=True,
        max_position_embeddings=512,
        norm_topk_prob=True,
    )
    model = Qwen3MoeForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    # transformers 5 writes `num_local_experts` and `rope_parameters`; the Qwen3-MoE
    # checkpoints on the Hub (and roll) name them `num_experts` and `rope_theta`.
    written = json.loads((out / "config.json").read_text())
    written["num_experts"] = EXPERTS
    written["rope_theta"] = 10000.0
    (out / "config.json").write_text(json.dumps(written, indent=2))
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(tokenizer / name, out / name)
    print(f"{out}: {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    main()
