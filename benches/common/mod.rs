//! Models shared by the Burn benches.

use roll_backend_burn::{CausalLm, Device, HfConfig};

/// The ~28M-parameter config of `shared/baselines.md`: hidden 512, 8 layers, 8/4 heads, ffn 1408,
/// vocab 8192, tied embeddings; random weights.
pub fn small_model(device: &Device) -> CausalLm {
    let mut cfg = HfConfig::new("qwen2", 8192, 512, 1408, 8, 8);
    cfg.num_key_value_heads = Some(4);
    cfg.tie_word_embeddings = true;
    CausalLm::init(&cfg, device).expect("valid config")
}
