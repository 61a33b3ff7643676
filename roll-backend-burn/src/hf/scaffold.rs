//! A new model from its sizes alone: a byte-level tokenizer and seeded weights, written as a
//! HuggingFace directory that loads like any other (in roll and in transformers).

use super::config::HfConfig;
use super::save::{SaveOptions, save_model, write_json};
use crate::models::CausalLm;
use crate::{BackendError, Device, Result};
use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{Tensor, TensorData};
use roll_core::config::{NewModel, NewTokenizer};
use roll_core::rng::SplitMix64;
use serde_json::json;
use std::path::Path;

/// The byte-level tokenizer's special tokens, after the 256 byte tokens: end of text (also EOS
/// and padding) and the ChatML markers.
pub const BYTE_SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Vocabulary size of the byte-level tokenizer: 256 bytes and [`BYTE_SPECIAL_TOKENS`].
pub const BYTE_VOCAB_SIZE: usize = 256 + BYTE_SPECIAL_TOKENS.len();

/// Writes a new model of `spec` to `dir`: `tokenizer.json`, `tokenizer_config.json`,
/// `config.json`, `generation_config.json` and `model.safetensors` with weights drawn from
/// `seed` (every matrix `N(0, initializer_range²)`, biases 0, norms 1, as transformers
/// initialises). The same spec, seed and corpus write the same files.
///
/// The tokenizer is byte-level BPE: token `b` is byte `b` (so any text encodes and every id
/// decodes), then the three [`BYTE_SPECIAL_TOKENS`], then — with
/// [`NewTokenizer::Bpe`] — the merges learned from `corpus` (see [`learn_merges`]). The
/// corpus is read only for a BPE tokenizer.
///
/// # Errors
/// [`BackendError::InvalidConfig`] for sizes the architecture refuses or a BPE tokenizer with
/// an empty corpus; [`BackendError::Io`] / [`BackendError::Save`] naming a file that could not be
/// written.
pub fn write_new_model(
    spec: &NewModel,
    dir: impl AsRef<Path>,
    seed: u64,
    corpus: &[&str],
) -> Result<()> {
    let dir = dir.as_ref();
    let merges = match spec.tokenizer {
        NewTokenizer::Bytes => Vec::new(),
        NewTokenizer::Bpe { vocab_size } => learn_merges(corpus, vocab_size as usize)?,
    };
    let config = hf_config(spec, BYTE_VOCAB_SIZE + merges.len())?;
    let device = Device::flex();
    let model = CausalLm::init(&config, &device)?;
    let model = map_model(model, &mut HfInit::new(seed, spec.initializer_range));
    std::fs::create_dir_all(dir).map_err(|e| BackendError::io(dir, e))?;
    let write = |name: &str, value: serde_json::Value| write_json(&dir.join(name), &value);
    write("tokenizer.json", byte_level_tokenizer(&merges))?;
    write(
        "tokenizer_config.json",
        json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": BYTE_SPECIAL_TOKENS[0],
            "pad_token": BYTE_SPECIAL_TOKENS[0],
            "model_max_length": spec.max_position_embeddings,
        }),
    )?;
    write(
        "generation_config.json",
        json!({ "bos_token_id": 256, "eos_token_id": 256, "pad_token_id": 256 }),
    )?;
    save_model(&model, dir, &SaveOptions::default())?;
    // Written last, over save_model's: the full config with token ids and context length.
    write_json(&dir.join("config.json"), &config)
}

/// Learns byte-level BPE merges from `corpus` until the vocabulary (the 259 byte-level tokens
/// plus one token per merge) reaches `vocab_size`, or no pair occurs twice: each round merges
/// the most frequent adjacent pair of tokens over the corpus (HF tokenizers' `BpeTrainer`,
/// whole texts as words, no pre-tokenisation). Returns the merges in order, each as the pair of
/// tokens in the GPT-2 byte-character spelling of `tokenizer.json`.
///
/// # Errors
/// [`BackendError::InvalidConfig`] for an empty corpus or a trainer failure.
pub fn learn_merges(corpus: &[&str], vocab_size: usize) -> Result<Vec<(String, String)>> {
    use std::str::FromStr;
    use tokenizers::models::TrainerWrapper;
    use tokenizers::models::bpe::BpeTrainerBuilder;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    let invalid =
        |why: String| BackendError::InvalidConfig(format!("model.source.tokenizer: {why}"));
    if corpus.iter().all(|t| t.is_empty()) {
        return Err(invalid(
            "a BPE tokenizer learns its merges from the run's SFT texts, and there are none \
             (give SFT examples, or use `kind = \"bytes\"`)"
                .into(),
        ));
    }
    let mut tokenizer = tokenizers::Tokenizer::from_str(&byte_level_tokenizer(&[]).to_string())
        .map_err(|e| invalid(format!("cannot build the byte-level tokenizer: {e}")))?;
    let specials = BYTE_SPECIAL_TOKENS
        .iter()
        .map(|t| tokenizers::AddedToken::from(*t, true))
        .collect();
    let trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut trainer = TrainerWrapper::from(trainer);
    tokenizer
        .train(&mut trainer, corpus.iter().copied())
        .map_err(|e| invalid(format!("BPE training failed: {e}")))?;
    let json: serde_json::Value = serde_json::from_str(
        &tokenizer
            .to_string(false)
            .map_err(|e| invalid(format!("cannot serialise the trained tokenizer: {e}")))?,
    )
    .map_err(|e| invalid(format!("cannot read the trained tokenizer: {e}")))?;
    // The pinned tokenizers (0.22) writes each merge as `["a", "b"]`.
    let merges = json["model"]["merges"]
        .as_array()
        .ok_or_else(|| invalid("the trained tokenizer has no merges list".into()))?;
    merges
        .iter()
        .map(|m| match m.as_array().map(Vec::as_slice) {
            Some([serde_json::Value::String(a), serde_json::Value::String(b)]) => {
                Ok((a.clone(), b.clone()))
            }
            _ => Err(invalid(format!("unexpected merge {m}"))),
        })
        .collect()
}

/// The HF config of `spec` with a vocabulary of `vocab_size` (the byte-level tokens, specials
/// and merges) and the byte-level special token ids.
fn hf_config(spec: &NewModel, vocab_size: usize) -> Result<HfConfig> {
    let mut c = HfConfig::new(
        spec.model_type.clone(),
        vocab_size,
        spec.hidden_size as usize,
        spec.intermediate_size as usize,
        spec.num_hidden_layers as usize,
        spec.num_attention_heads as usize,
    );
    c.num_key_value_heads = Some(spec.num_key_value_heads as usize);
    c.rope_theta = Some(spec.rope_theta);
    c.max_position_embeddings = Some(spec.max_position_embeddings as usize);
    c.tie_word_embeddings = true;
    let architecture = match spec.model_type.as_str() {
        "qwen3" => "Qwen3ForCausalLM",
        _ => "Qwen2ForCausalLM",
    };
    for (key, value) in [
        ("architectures", json!([architecture])),
        ("bos_token_id", json!(256)),
        ("eos_token_id", json!(256)),
        ("pad_token_id", json!(256)),
        ("hidden_act", json!("silu")),
        ("initializer_range", json!(spec.initializer_range)),
        ("torch_dtype", json!("float32")),
    ] {
        c.extra.insert(key.into(), value);
    }
    c.validate()?;
    Ok(c)
}

/// GPT-2's byte ↔ printable-character map: byte `b` is written as this character in the vocab.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        char::from(b)
    } else {
        let shift = (0..b).filter(|&x| !printable(x)).count() as u32;
        char::from_u32(256 + shift).unwrap_or(char::REPLACEMENT_CHARACTER)
    }
}

/// `tokenizer.json` of a byte-level BPE with these merges (none: one token per byte).
fn byte_level_tokenizer(merges: &[(String, String)]) -> serde_json::Value {
    let mut vocab: serde_json::Map<String, serde_json::Value> = (0..=255u8)
        .map(|b| (byte_char(b).to_string(), json!(b)))
        .collect();
    // The specials are in the model's vocabulary too: tokenizers gives an added token that is
    // not the id `vocab.len() + k`, whatever id the file says, which would land on a merge.
    for (i, t) in BYTE_SPECIAL_TOKENS.iter().enumerate() {
        vocab.insert((*t).to_owned(), json!(256 + i));
    }
    // Merged tokens after the specials, in merge order.
    for (i, (a, b)) in merges.iter().enumerate() {
        vocab.insert(format!("{a}{b}"), json!(BYTE_VOCAB_SIZE + i));
    }
    let merges: Vec<serde_json::Value> = merges.iter().map(|(a, b)| json!([a, b])).collect();
    let added: Vec<serde_json::Value> = BYTE_SPECIAL_TOKENS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"id": 256 + i, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
                            "trim_offsets": false, "use_regex": false});
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    })
}

fn map_model(model: CausalLm, mapper: &mut HfInit) -> CausalLm {
    match model {
        CausalLm::Qwen2(m) => CausalLm::Qwen2(m.map(mapper)),
        CausalLm::Qwen3(m) => CausalLm::Qwen3(m.map(mapper)),
        CausalLm::Qwen3Moe(m) => CausalLm::Qwen3Moe(m.map(mapper)),
    }
}

/// transformers' initialisation, from our own seeded generator (so the weights do not depend on
/// the backend's random state): matrices `N(0, std²)`, biases 0, norm weights left at 1.
struct HfInit {
    rng: SplitMix64,
    std: f64,
    field: String,
}

impl HfInit {
    fn new(seed: u64, std: f64) -> Self {
        Self {
            rng: SplitMix64::new(seed),
            std,
            field: String::new(),
        }
    }

    /// A standard normal draw (Box–Muller).
    fn normal(&mut self) -> f64 {
        let u1 = self.rng.next_f64().max(f64::MIN_POSITIVE);
        let u2 = self.rng.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

impl ModuleMapper for HfInit {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.field = name.to_owned();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let is_bias = self.field == "bias";
        param.map(|t| {
            let shape = t.shape();
            let n = shape.num_elements();
            let values: Vec<f32> = if D >= 2 {
                (0..n).map(|_| (self.normal() * self.std) as f32).collect()
            } else if is_bias {
                vec![0.0; n]
            } else {
                return t;
            };
            Tensor::from_data(TensorData::new(values, shape), &t.device())
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::HfTokenizer;
    use roll_core::Tokenizer;

    #[test]
    fn byte_map_is_a_bijection_onto_gpt2_characters() {
        let chars: std::collections::BTreeSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        assert_eq!(byte_char(b'A'), 'A');
    }

    /// A small Qwen2 with `layers` layers and `tokenizer`.
    fn spec(layers: u32, tokenizer: NewTokenizer) -> NewModel {
        NewModel {
            model_type: "qwen2".into(),
            hidden_size: 32,
            intermediate_size: 64,
            num_hidden_layers: layers,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            max_position_embeddings: 64,
            rope_theta: 10_000.0,
            initializer_range: 0.02,
            tokenizer,
        }
    }

    #[test]
    fn new_model_directory_loads_and_round_trips_text() {
        let dir = std::env::temp_dir().join(format!("roll-new-model-{}", std::process::id()));
        let spec = spec(2, NewTokenizer::Bytes);
        write_new_model(&spec, &dir, 7, &[]).unwrap();
        let tok = HfTokenizer::from_dir(&dir).unwrap();
        let text = "Q: 12+35=? A: 47 é<|endoftext|>";
        let ids = tok.encode(text).unwrap();
        assert_eq!(
            ids[..3],
            [u32::from(b'Q'), u32::from(b':'), u32::from(b' ')]
        );
        assert_eq!(*ids.last().unwrap(), 256);
        assert_eq!(tok.decode(&ids).unwrap(), text);
        assert_eq!(tok.eos_token_id(), Some(256));
        let source = crate::hf::HfSource::open(&dir).unwrap();
        assert_eq!(source.config().vocab_size, BYTE_VOCAB_SIZE);
        let a = crate::hf::load_model(&dir, &Device::flex()).unwrap();
        // Same seed, same weights; another seed, other weights.
        let again = dir.with_extension("again");
        write_new_model(&spec, &again, 7, &[]).unwrap();
        let other = dir.with_extension("other");
        write_new_model(&spec, &other, 8, &[]).unwrap();
        let bytes = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
        assert_eq!(bytes(&dir), bytes(&again));
        assert_ne!(bytes(&dir), bytes(&other));
        assert_eq!(a.vocab_size(), BYTE_VOCAB_SIZE);
        for d in [dir, again, other] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn a_bpe_tokenizer_learns_the_corpus_and_still_encodes_any_text() {
        let dir = std::env::temp_dir().join(format!("roll-new-bpe-{}", std::process::id()));
        let spec = spec(1, NewTokenizer::Bpe { vocab_size: 300 });
        let lines: Vec<String> = (0..50)
            .map(|i| format!("Observation:\nP__G\nYou have {} actions left.", i % 7))
            .collect();
        let corpus: Vec<&str> = lines.iter().map(String::as_str).collect();
        write_new_model(&spec, &dir, 1, &corpus).unwrap();
        let tok = HfTokenizer::from_dir(&dir).unwrap();
        let source = crate::hf::HfSource::open(&dir).unwrap();
        let vocab = source.config().vocab_size;
        assert!(
            vocab > BYTE_VOCAB_SIZE && vocab <= 300,
            "{vocab} tokens: merges were learned, within the budget"
        );
        // A corpus line shrinks to a few tokens; bytes and specials keep their ids, so any text
        // still encodes and decodes.
        let line = tok.encode(&lines[3]).unwrap();
        assert!(line.len() * 4 < lines[3].len(), "{} tokens", line.len());
        assert_eq!(tok.decode(&line).unwrap(), lines[3]);
        let unseen = "zébra <|endoftext|>";
        let ids = tok.encode(unseen).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), unseen);
        assert_eq!(*ids.last().unwrap(), 256);
        assert_eq!(tok.eos_token_id(), Some(256));
        assert!(ids.iter().all(|&i| (i as usize) < vocab));
        let model = crate::hf::load_model(&dir, &Device::flex()).unwrap();
        assert_eq!(model.vocab_size(), vocab);
        // The same corpus learns the same merges.
        let again = dir.with_extension("again");
        write_new_model(&spec, &again, 1, &corpus).unwrap();
        let read = |d: &Path| std::fs::read(d.join("tokenizer.json")).unwrap();
        assert_eq!(read(&dir), read(&again));
        // No corpus: the error says where the texts come from.
        let err = write_new_model(&spec, dir.with_extension("none"), 1, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("SFT") && err.contains("tokenizer"), "{err}");
        for d in [dir, again] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }
}
