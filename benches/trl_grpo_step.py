"""HF TRL's GRPOTrainer on the work of `cargo bench --bench rl_step`: the tiny-qwen2-sft fixture,
8 prompts x 8 samples x at most 6 new tokens, an exact-answer reward, one AdamW step per batch, on
the CPU. Prints the median step time and its parts: generation, reward, scoring (log-probs
computed without gradients: old or reference log-probs, when TRL needs them), the optimiser step,
and the rest (the training forward with gradients, loss, backward, batch preparation).

    python -m venv /tmp/trlenv && /tmp/trlenv/bin/pip install torch transformers trl datasets
    /tmp/trlenv/bin/python benches/trl_grpo_step.py [--steps 40]

Run it with the machine otherwise idle, right after (or before) the roll bench.
"""

import argparse
import pathlib
import random
import statistics
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

FIXTURE = pathlib.Path(__file__).resolve().parent.parent.parent / "shared/fixtures/tiny-qwen2-sft"


def prompts(n):
    rng = random.Random(7)
    rows = {"prompt": [], "answer": []}
    for _ in range(n):
        a, b = rng.randrange(100), rng.randrange(100)
        rows["prompt"].append(f"Q: {a}+{b}=? A:")
        rows["answer"].append(str(a + b))
    return Dataset.from_dict(rows)


class Timer:
    """Seconds spent in each timed part during the current step."""

    def __init__(self):
        self.parts = {}

    def wrap(self, name, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.parts[name] = self.parts.get(name, 0.0) + time.perf_counter() - start

        return timed


class StepClock(TrainerCallback):
    def __init__(self, timer):
        self.timer = timer
        self.steps = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.timer.parts = {}
        self.start = time.perf_counter()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.optimizer_start = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        spent = time.perf_counter() - self.optimizer_start
        self.timer.parts["optimizer"] = self.timer.parts.get("optimizer", 0.0) + spent

    def on_step_end(self, args, state, control, **kwargs):
        total = time.perf_counter() - self.start
        self.steps.append((total, dict(self.timer.parts)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    timer = Timer()

    def exact_answer(completions, answer, **kwargs):
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

    reward = timer.wrap("reward", exact_answer)
    reward.__name__ = "exact_answer"
    tokenizer = AutoTokenizer.from_pretrained(FIXTURE)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(FIXTURE, dtype=torch.float32)
    model.generate = timer.wrap("generation", model.generate)
    config = GRPOConfig(
        output_dir="/tmp/trl_grpo_step",
        per_device_train_batch_size=64,
        num_generations=8,
        max_completion_length=6,
        max_steps=args.steps + args.warmup,
        learning_rate=1e-6,
        temperature=1.0,
        beta=0.0,  # no reference model, as in roll's bench (no KL term)
        gradient_checkpointing=False,  # TRL's default recomputes activations: slower here
        bf16=False,  # TRL defaults to bf16 autocast; roll and the PyTorch baseline run f32
        logging_steps=1_000_000,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=prompts(64 * (args.steps + args.warmup)),
        processing_class=tokenizer,
    )
    # Log-probs: without gradients they are scoring (old or reference log-probs), with them the
    # training forward (counted in the rest).
    logps = trainer._get_per_token_logps_and_entropies
    scoring = timer.wrap("scoring", logps)

    def per_token_logps(*args, **kwargs):
        return (logps if torch.is_grad_enabled() else scoring)(*args, **kwargs)

    trainer._get_per_token_logps_and_entropies = per_token_logps
    clock = StepClock(timer)
    trainer.add_callback(clock)
    trainer.train()
    measured = clock.steps[args.warmup :]
    total = statistics.median(t for t, _ in measured)
    part = {
        name: statistics.median(p.get(name, 0.0) for _, p in measured)
        for name in ["generation", "reward", "scoring", "optimizer"]
    }
    rest = total - sum(part.values())
    print(
        f"TRL GRPOTrainer, tiny-qwen2-sft 8x8x6, {len(measured)} steps, torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads: median step {total * 1e3:.1f} ms "
        f"({1 / total:.2f} steps/s): generation {part['generation'] * 1e3:.1f} ms, reward "
        f"{part['reward'] * 1e3:.2f} ms, scoring {part['scoring'] * 1e3:.1f} ms, optimizer step "
        f"{part['optimizer'] * 1e3:.1f} ms, the rest (training forward, loss, backward, batch "
        f"preparation) {rest * 1e3:.1f} ms (medians of each part)"
    )


if __name__ == "__main__":
    main()
