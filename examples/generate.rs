//! Sampled continuations of one prompt from a HuggingFace model directory, with timing.
//!
//! ```text
//! cargo run --release --example generate
//! cargo run --release --example generate -- --model ../shared/fixtures/tiny-qwen2-sft \
//!     --prompt "Q: 12+35=? A:" -n 8 --max-new-tokens 24 --temperature 0.8 --top-p 0.95 --seed 1
//! ```
//!
//! All `n` requests go to the inference engine at once and are decoded as one continuous batch.
//! On bad input it prints a one-line error on stderr and exits non-zero (2 for usage errors).

use roll_backend_burn::engine::{DecoderKind, Engine, EngineConfig};
use roll_backend_burn::{Device, HfTokenizer, load_model};
use roll_core::Tokenizer;
use roll_core::policy::{GenerationRequest, SamplingParams};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

const USAGE: &str = "usage: generate [--model DIR] [--prompt TEXT] [-n N] [--max-new-tokens N] \
                     [--temperature T] [--top-p P] [--top-k K] [--seed S]";

struct Args {
    model: String,
    prompt: String,
    n: usize,
    params: SamplingParams,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        model: concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../shared/fixtures/tiny-qwen2-sft"
        )
        .into(),
        prompt: "Q: 12+35=? A:".into(),
        n: 4,
        params: SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            max_new_tokens: 24,
            seed: Some(0),
            ..SamplingParams::default()
        },
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.into());
        }
        let value = it.next().ok_or(format!("{flag} needs a value; {USAGE}"))?;
        let num = |what: &str| format!("{flag} must be {what}, got `{value}`");
        match flag.as_str() {
            "--model" => args.model = value,
            "--prompt" => args.prompt = value,
            "-n" => args.n = value.parse().map_err(|_| num("a count"))?,
            "--max-new-tokens" => {
                args.params.max_new_tokens = value.parse().map_err(|_| num("a count"))?
            }
            "--temperature" => {
                args.params.temperature = value.parse().map_err(|_| num("a number"))?
            }
            "--top-p" => args.params.top_p = value.parse().map_err(|_| num("a number"))?,
            "--top-k" => args.params.top_k = Some(value.parse().map_err(|_| num("a count"))?),
            "--seed" => args.params.seed = Some(value.parse().map_err(|_| num("an integer"))?),
            _ => return Err(format!("unknown argument `{flag}`; {USAGE}")),
        }
    }
    if args.n == 0 {
        return Err("-n must be at least 1".into());
    }
    Ok(args)
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::flex();
    let model = load_model(&args.model, &device)?;
    let tokenizer = Arc::new(HfTokenizer::from_dir(&args.model)?);
    let kind = DecoderKind::auto(&model, &device);
    let config = EngineConfig {
        eos_token_ids: tokenizer.eos_token_id().into_iter().collect(),
        ..EngineConfig::default()
    };
    let engine = Engine::with_decoder(kind, &model, &device, config, Some(tokenizer.clone()))?;
    let prompt = tokenizer.encode(&args.prompt)?;
    println!(
        "model {} ({kind:?} decoder), prompt {:?} ({} tokens), {} samples",
        args.model,
        args.prompt,
        prompt.len(),
        args.n
    );
    let start = Instant::now();
    let handles = (0..args.n)
        .map(|i| {
            let mut params = args.params.clone();
            params.seed = params.seed.map(|s| s + i as u64);
            engine.submit(GenerationRequest::new(prompt.clone(), params))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut tokens = 0;
    for (i, handle) in handles.into_iter().enumerate() {
        let g = handle.wait()?;
        tokens += g.token_ids.len();
        let mean_logprob = g.logprobs.iter().sum::<f32>() / g.logprobs.len().max(1) as f32;
        println!(
            "[{i}] {:?}  ({} tokens, {:?}, mean log-prob {mean_logprob:.3})",
            g.text,
            g.token_ids.len(),
            g.finish_reason
        );
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{tokens} new tokens in {:.3} s: {:.0} tokens/s",
        secs,
        tokens as f64 / secs
    );
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
