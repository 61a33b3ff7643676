//! The examples' command line: a config file (the example's own unless `--config FILE`),
//! `key.path=value` overrides, and `--model DIR` to start from an HF directory instead of a
//! model built from scratch; and what every example does at the end: build the run, train it,
//! say where its directory is.

use roll::core::config::{Config, ModelSource};
use roll::prelude::RunBuilder;

/// The config of `default` (a path under the crate) with the command line applied.
pub fn config(default: &str) -> anyhow::Result<Config> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let model = match args.iter().position(|a| a == "--model") {
        Some(i) if i + 1 < args.len() => Some(args.drain(i..=i + 1).nth(1).unwrap_or_default()),
        Some(_) => anyhow::bail!("--model needs a directory"),
        None => None,
    };
    if !args.iter().any(|a| a.starts_with("--config") || a == "-c") {
        let file = root.join(default).display().to_string();
        args.splice(0..0, ["--config".to_owned(), file]);
    }
    let mut config = Config::from_args(args)?;
    if let Some(dir) = model {
        config.model.source = ModelSource::HfDir { path: dir.into() };
        config.validate()?;
    }
    Ok(config)
}

/// Builds `run`, trains it to the end and prints its summary and where its files are.
pub async fn train(run: RunBuilder) -> anyhow::Result<()> {
    let mut run = run.build()?;
    let dir = run.plan().run.output_dir.display().to_string();
    println!("resolved config: {dir}/config.toml");
    let summary = run.train().await?;
    println!("\n{summary}");
    println!("summary: {dir}/summary.md\nmetrics: {dir}/metrics.jsonl");
    Ok(())
}
