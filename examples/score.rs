//! Scores a token sequence with a HuggingFace model directory and prints one JSON object:
//! `{"ids": [...], "logprobs": [...]}` with `logprobs[t] = log p(ids[t+1] | ids[..=t])`.
//!
//! ```text
//! cargo run --release --example score -- --model ../shared/fixtures/tiny-qwen2 --ids 51,28,223
//! cargo run --release --example score -- --model ../shared/fixtures/tiny-qwen2 --text "Q: 1+1=? A:"
//! ```
//!
//! On bad input it prints a one-line error on stderr and exits non-zero (2 for usage errors).

use std::process::ExitCode;

use roll_backend_burn::{Device, HfTokenizer, ScoringOptions, load_model, score};
use roll_core::Tokenizer;
use roll_core::policy::{ScoreRequest, ScoreSequence};

const USAGE: &str = "usage: score --model DIR (--ids 1,2,3 | --text TEXT)";

enum Input {
    Ids(Vec<u32>),
    Text(String),
}

fn parse_args() -> Result<(String, Input), String> {
    let mut args = std::env::args().skip(1);
    let (mut model, mut input) = (None, None);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value; {USAGE}"));
        match arg.as_str() {
            "--model" => model = Some(value()?),
            "--ids" => {
                let ids = value()?
                    .split(',')
                    .map(|s| s.trim().parse::<u32>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("--ids must be comma-separated token ids: {e}"))?;
                input = Some(Input::Ids(ids));
            }
            "--text" => input = Some(Input::Text(value()?)),
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument `{other}`; {USAGE}")),
        }
    }
    match (model, input) {
        (Some(m), Some(i)) => Ok((m, i)),
        _ => Err(USAGE.to_string()),
    }
}

fn run(model_dir: &str, input: Input) -> anyhow::Result<serde_json::Value> {
    let device = Device::flex();
    let ids = match input {
        Input::Ids(ids) => ids,
        Input::Text(text) => HfTokenizer::from_dir(model_dir)?.encode(&text)?,
    };
    if ids.is_empty() {
        anyhow::bail!("no tokens to score");
    }
    let model = load_model(model_dir, &device)?;
    let request = ScoreRequest {
        sequences: vec![ScoreSequence {
            prompt_ids: ids[..1].to_vec(),
            response_ids: ids[1..].to_vec(),
        }],
        with_entropy: false,
        ..Default::default()
    };
    let scores = score(&model, None, &request, &ScoringOptions::default(), &device)?;
    let logprobs = scores
        .into_iter()
        .next()
        .map(|s| s.logprobs)
        .unwrap_or_default();
    Ok(serde_json::json!({ "ids": ids, "logprobs": logprobs }))
}

fn main() -> ExitCode {
    let (model, input) = match parse_args() {
        Ok(x) => x,
        Err(msg) => {
            eprintln!("error: {msg}");
            return ExitCode::from(2);
        }
    };
    match run(&model, input) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", e.to_string().replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}
