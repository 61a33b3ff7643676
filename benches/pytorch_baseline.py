"""PyTorch + HF transformers reference for benches/generate.rs, benches/scoring.rs and
benches/train.rs: the same shapes as ../shared/baselines.md, measured on *this* machine so that
ratios compare like with like.

    python -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch transformers safetensors
    /tmp/torchenv/bin/python benches/pytorch_baseline.py tiny    # the tiny-qwen2 fixture
    /tmp/torchenv/bin/python benches/pytorch_baseline.py small   # the ~28M config
    python benches/pytorch_baseline.py small cuda                  # on an NVIDIA GPU (f32, tf32 off)

Medians of 5 runs after a warm-up, 2 threads, f32, sdpa attention; run it on an idle machine.
With a second argument `cuda` everything runs on the GPU (synchronised before each clock read),
the peak memory printed is the GPU's (`torch.cuda.max_memory_allocated`), and the matmul peak
adds a 4096^3 product; roll's side of it is `roll-backend-burn/benches/gpu.rs`.
Besides generation, scoring and the 16x128 train step: the peak RSS of the train steps, a train
step on 16 sequences of 16-256 tokens packed and padded, and the matmul peak (the same shapes
as benches/train.rs).
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
dev = torch.device(sys.argv[2] if len(sys.argv) > 2 else "cpu")
cuda = dev.type == "cuda"
if cuda:
    # roll's GPU path computes in f32: compare with f32 products, not TF32's 10-bit mantissas.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    _med = med
    def med(f, n):
        def synced():
            f(); torch.cuda.synchronize()
        return _med(synced, n)
if which == "tiny":
    m = Qwen2ForCausalLM.from_pretrained(__import__("os").path.join(__import__("os").path.dirname(__file__), "../../shared/fixtures/tiny-qwen2"), attn_implementation="sdpa")
else:
    cfg = Qwen2Config(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    m = Qwen2ForCausalLM(cfg)
m = m.to(dev).eval()
V = m.config.vocab_size
ids = torch.randint(1, V, (32, 16), device=dev)
def gen():
    with torch.no_grad():
        out = m.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                         max_new_tokens=64, min_new_tokens=64, pad_token_id=0)
    assert out.shape[1] == 80
g = med(gen, 5); print(f"{which} generate b32: {g:.3f} s, {32*64/g:.0f} new tok/s", flush=True)
x = torch.randint(1, V, (16, 128), device=dev)
def fwd():
    with torch.no_grad(): m(x).logits.log_softmax(-1)
s = med(fwd, 5); print(f"{which} score 16x128: {s:.3f} s, {2048/s:.0f} tok/s", flush=True)
m.train()
opt = torch.optim.AdamW(m.parameters(), lr=1e-5)
def step():
    logits = m(x).logits[:, :-1]
    lp = logits.log_softmax(-1).gather(-1, x[:, 1:, None]).squeeze(-1)
    loss = -lp.mean(); opt.zero_grad(); loss.backward(); opt.step()
def peak_rss_mib():
    if cuda:
        return torch.cuda.max_memory_allocated() / 2**20
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
if cuda:
    torch.cuda.reset_peak_memory_stats()
else:
    open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM (Linux), as benches/train.rs does
t = med(step, 5); print(f"{which} train 16x128: {t:.3f} s, {2048/t:.0f} tok/s", flush=True)
print(f"{which} peak {'GPU memory' if cuda else 'RSS'} of the train steps: {peak_rss_mib():.0f} MiB", flush=True)

# Mixed lengths, as benches/train.rs's train_step_mixed: 16 sequences of 16, 32, ..., 256 tokens.
# Padded: one [16, 256] batch with an attention mask. Packed: one row of 2,176 tokens whose
# position ids restart at each sequence; transformers (>= 4.56) then builds a block-causal mask
# for sdpa, so no sequence attends to another (without the KV cache: use_cache=False).
lens = [16 * (i + 1) for i in range(16)]
seqs = [torch.randint(1, V, (n,), device=dev) for n in lens]
real = sum(lens)
pad = torch.zeros(16, 256, dtype=torch.long, device=dev); am = torch.zeros(16, 256, dtype=torch.long, device=dev)
for i, q in enumerate(seqs):
    pad[i, :len(q)] = q; am[i, :len(q)] = 1
def masked_step(ids, targets, mask, **kw):
    logits = m(ids, use_cache=False, **kw).logits[:, :-1]
    lp = logits.log_softmax(-1).gather(-1, targets[:, :, None]).squeeze(-1)
    loss = -(lp * mask).sum() / mask.sum(); opt.zero_grad(); loss.backward(); opt.step()
def padded():
    masked_step(pad, pad[:, 1:], am[:, 1:].float(), attention_mask=am)
packed_ids = torch.cat(seqs)[None]
pos = torch.cat([torch.arange(n, device=dev) for n in lens])[None]
# A target that starts the next sequence is not predicted by this one.
cross = (pos[:, 1:] != 0).float()
def packed():
    masked_step(packed_ids, packed_ids[:, 1:], cross, position_ids=pos)
for name, f in [("packed", packed), ("padded", padded)]:
    t = med(f, 5); print(f"{which} train mixed 16-256 {name}: {t:.3f} s, {real/t:.0f} real tok/s", flush=True)

for (mm, kk, nn) in [(2048, 512, 1408), (1024, 128, 704), (1024, 352, 128)] + ([(4096, 4096, 4096)] if cuda else []):
    a = torch.randn(mm, kk, device=dev); w = torch.randn(kk, nn, device=dev)
    p = med(lambda: a @ w, 20)
    print(f"matmul {mm}x{kk}x{nn}: {p*1e3:.3f} ms, {2*mm*kk*nn/p/1e9:.1f} GFLOP/s", flush=True)
