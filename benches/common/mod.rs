//! Models shared by the Burn benches.

use roll_backend_burn::{CausalLm, Device, HfConfig, load_model};
use std::path::PathBuf;

/// The ~28M-parameter config of `shared/baselines.md`: hidden 512, 8 layers, 8/4 heads, ffn 1408,
/// vocab 8192, tied embeddings; random weights.
fn small_model(device: &Device) -> CausalLm {
    let mut cfg = HfConfig::new("qwen2", 8192, 512, 1408, 8, 8);
    cfg.num_key_value_heads = Some(4);
    cfg.tie_word_embeddings = true;
    CausalLm::init(&cfg, device).expect("valid config")
}

/// The models every Burn bench runs: the `tiny-qwen2` fixture (skipped with a message when
/// `../shared` is absent) and the 28M config.
pub fn bench_models(device: &Device) -> Vec<(&'static str, CausalLm)> {
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/tiny-qwen2");
    let mut models = Vec::new();
    match load_model(&fixture, device) {
        Ok(m) => models.push(("tiny", m)),
        Err(e) => eprintln!("skipping tiny fixture: {e}"),
    }
    models.push(("small-28M", small_model(device)));
    models
}
