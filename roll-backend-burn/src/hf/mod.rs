//! HuggingFace model directories in and out: `config.json` (transformers 4.x and 5.x
//! spellings, validated), `generation_config.json`, `*.safetensors` (single file or sharded with
//! `model.safetensors.index.json`), a lossless export of a trained model under the directory it
//! was loaded from, and LoRA adapters in PEFT's layout.

mod config;
mod export;
mod load;
mod peft;
mod safetensors_file;
mod save;
mod scaffold;
mod source;
mod validate;

pub(crate) use config::read_json_value;
pub use config::{GenerationConfig, HfConfig, RopeParameters};
pub use export::export_hf_dir;
pub use load::{load_model, load_weights};
pub use peft::export_peft_adapter;
pub use save::{SaveDtype, SaveOptions, save_model, save_weights};
pub use scaffold::{BYTE_SPECIAL_TOKENS, BYTE_VOCAB_SIZE, learn_merges, write_new_model};
pub use source::{HfSource, load_model_and_source};
