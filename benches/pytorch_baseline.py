"""PyTorch + HF transformers reference for benches/generate.rs, benches/scoring.rs and
benches/train.rs: the same shapes as ../shared/baselines.md, measured on *this* machine so that
ratios compare like with like.

    python -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch transformers safetensors
    /tmp/torchenv/bin/python benches/pytorch_baseline.py tiny    # the tiny-qwen2 fixture
    /tmp/torchenv/bin/python benches/pytorch_baseline.py small   # the ~28M config

Medians of 5 runs after a warm-up, 2 threads, f32, sdpa attention; run it on an idle machine.
"""
import time, statistics, sys, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
torch.set_num_threads(2)
torch.manual_seed(0)
def med(f, n):
    f(); ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    return statistics.median(ts)
which = sys.argv[1]
if which == "tiny":
    m = Qwen2ForCausalLM.from_pretrained(__import__("os").path.join(__import__("os").path.dirname(__file__), "../../shared/fixtures/tiny-qwen2"), attn_implementation="sdpa")
else:
    cfg = Qwen2Config(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    m = Qwen2ForCausalLM(cfg)
m.eval()
V = m.config.vocab_size
ids = torch.randint(1, V, (32, 16))
def gen():
    with torch.no_grad():
        out = m.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                         max_new_tokens=64, min_new_tokens=64, pad_token_id=0)
    assert out.shape[1] == 80
g = med(gen, 5); print(f"{which} generate b32: {g:.3f} s, {32*64/g:.0f} new tok/s", flush=True)
x = torch.randint(1, V, (16, 128))
def fwd():
    with torch.no_grad(): m(x).logits.log_softmax(-1)
s = med(fwd, 5); print(f"{which} score 16x128: {s:.3f} s, {2048/s:.0f} tok/s", flush=True)
m.train()
opt = torch.optim.AdamW(m.parameters(), lr=1e-5)
def step():
    logits = m(x).logits[:, :-1]
    lp = logits.log_softmax(-1).gather(-1, x[:, 1:, None]).squeeze(-1)
    loss = -lp.mean(); opt.zero_grad(); loss.backward(); opt.step()
t = med(step, 5); print(f"{which} train 16x128: {t:.3f} s, {2048/t:.0f} tok/s", flush=True)
