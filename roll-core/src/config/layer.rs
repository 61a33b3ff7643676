//! The layers a config is merged from (defaults, files, environment variables, overrides), each
//! a figment provider whose name is the origin shown in errors, and the `kind`-switch rule.

use std::fmt;
use std::path::{Path, PathBuf};

use figment::providers::{Format as _, Toml, Yaml};
use figment::value::{Dict, Map, Value};
use figment::{Metadata, Profile, Provider};

use super::{Config, ModelConfig, ModelSource};
use crate::{Error, Result};

/// The syntax of a config file.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FileFormat {
    /// TOML.
    Toml,
    /// YAML.
    Yaml,
}

impl fmt::Display for FileFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Toml => "TOML",
            Self::Yaml => "YAML",
        })
    }
}

/// One source's keys; its metadata name is the origin shown in errors.
#[derive(Debug, Clone)]
pub(crate) struct Layer {
    origin: String,
    data: Dict,
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.origin.clone())
    }

    fn data(&self) -> figment::Result<Map<Profile, Dict>> {
        Ok(Profile::Default.collect(self.data.clone()))
    }
}

impl Layer {
    /// The layer that sets the dotted `key` to `raw`, parsed like figment's `Env` values.
    pub(crate) fn key_value(origin: String, key: &[String], raw: &str, hint: &str) -> Result<Self> {
        let valid_segment = |s: &String| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        if key.is_empty() || !key.iter().all(valid_segment) {
            return Err(Error::ConfigSource {
                origin,
                message: hint.to_owned(),
            });
        }
        let mut data = Dict::new();
        insert(&mut data, key, parse_value(raw));
        Ok(Self { origin, data })
    }
}

/// Parses a value like figment's `Env` provider, and also reads exponent floats (`1e-6`), which
/// figment would leave a string.
fn parse_value(raw: &str) -> Value {
    let value: Value = match raw.parse() {
        Ok(value) => value,
        Err(never) => match never {},
    };
    let bare = raw.trim();
    match (&value, bare.parse::<f64>()) {
        (Value::String(..), Ok(float)) if bare.bytes().any(|b| b.is_ascii_digit()) => {
            Value::from(float)
        }
        _ => value,
    }
}

pub(crate) fn file_layer(path: &Path) -> Result<Layer> {
    let extension = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let format = match extension.to_ascii_lowercase().as_str() {
        "toml" => FileFormat::Toml,
        "yaml" | "yml" => FileFormat::Yaml,
        _ => {
            return Err(Error::ConfigSource {
                origin: format!("file {}", path.display()),
                message: format!(
                    "unsupported extension `{extension}`: config files are `.toml`, `.yaml` or `.yml`"
                ),
            });
        }
    };
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        action: "cannot read config file",
        path: path.to_owned(),
        source,
    })?;
    parse_layer(format, &text, format!("file {}", path.display()))
}

/// The largest config text accepted, in bytes: real configs are a few KiB.
pub(crate) const MAX_CONFIG_BYTES: usize = 1 << 20;
/// The deepest nesting of `[`/`{` accepted: the config tree is a few levels deep, and parsers
/// take time (a YAML parser tens of seconds) to refuse hostile nesting on their own.
pub(crate) const MAX_CONFIG_NESTING: usize = 64;

/// Refuses text too large or too deeply nested to be a config, before any parser sees it.
fn check_shape(text: &str, origin: &str) -> Result<()> {
    let refuse = |message: String| {
        Err(Error::ConfigSource {
            origin: origin.to_owned(),
            message,
        })
    };
    if text.len() > MAX_CONFIG_BYTES {
        return refuse(format!(
            "{} bytes is more than a config can be ({MAX_CONFIG_BYTES} bytes)",
            text.len()
        ));
    }
    // Brackets inside quoted strings or comments do not nest. Quotes and comments end at the
    // line's end (a quote the parser would not see as one only hides brackets it would read as
    // text, so nothing deep gets through).
    let (mut depth, mut quote, mut comment) = (0usize, None::<char>, false);
    let mut escaped = false;
    for c in text.chars() {
        if c == '\n' {
            (quote, comment, escaped) = (None, false, false);
            continue;
        }
        match (quote, c) {
            _ if comment => {}
            (Some(_), _) if escaped => escaped = false,
            (Some('"'), '\\') => escaped = true,
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '#') => comment = true,
            (None, '[' | '{') => {
                depth += 1;
                if depth > MAX_CONFIG_NESTING {
                    return refuse(format!(
                        "brackets nested more than {MAX_CONFIG_NESTING} deep; a config is a few \
                         levels deep"
                    ));
                }
            }
            (None, ']' | '}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

pub(crate) fn parse_layer(format: FileFormat, text: &str, origin: String) -> Result<Layer> {
    check_shape(text, &origin)?;
    let data = match format {
        FileFormat::Toml => Toml::string(text).data(),
        FileFormat::Yaml => Yaml::string(text).data(),
    };
    match data {
        Ok(mut profiles) => Ok(Layer {
            data: profiles.remove(&Profile::Default).unwrap_or_default(),
            origin,
        }),
        Err(e) => Err(Error::ConfigSource {
            origin,
            message: e.to_string(),
        }),
    }
}

/// The `kind` of every tagged section that has a default (`train.optimizer.kind = "adam_w"`,
/// ...), as the lowest layer: a source may then set one field of such a section without
/// repeating its kind.
pub(crate) fn default_kinds() -> Layer {
    let placeholder = ModelSource::HfDir {
        path: PathBuf::new(),
    };
    let mut data = Dict::new();
    if let Ok(Value::Dict(_, defaults)) =
        Value::serialize(Config::new(ModelConfig::new(placeholder)))
    {
        let mut kinds = Vec::new();
        collect_kinds(&defaults, &mut Vec::new(), &mut kinds);
        for (mut path, kind) in kinds {
            if path.first().is_some_and(|section| section != "model") {
                path.push("kind".to_owned());
                insert(&mut data, &path, Value::from(kind));
            }
        }
    }
    Layer {
        origin: "default".to_owned(),
        data,
    }
}

/// When a later layer sets `<section>.kind` to another value than the earlier layers had, the
/// earlier layers' keys of that section are dropped: switching kind starts the section afresh.
pub(crate) fn apply_kind_switches(layers: &mut [Layer]) {
    for i in 1..layers.len() {
        let (earlier, later) = layers.split_at_mut(i);
        let mut kinds = Vec::new();
        collect_kinds(&later[0].data, &mut Vec::new(), &mut kinds);
        for (path, kind) in kinds {
            let switched = earlier
                .iter()
                .rev()
                .find_map(|layer| kind_at(&layer.data, &path))
                .is_some_and(|before| before != kind);
            if switched {
                earlier
                    .iter_mut()
                    .for_each(|layer| remove(&mut layer.data, &path));
            }
        }
    }
}

fn collect_kinds(dict: &Dict, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
    if let (false, Some(Value::String(_, kind))) = (prefix.is_empty(), dict.get("kind")) {
        out.push((prefix.clone(), kind.clone()));
    }
    for (key, value) in dict {
        if let Value::Dict(_, inner) = value {
            prefix.push(key.clone());
            collect_kinds(inner, prefix, out);
            prefix.pop();
        }
    }
}

fn kind_at<'d>(dict: &'d Dict, path: &[String]) -> Option<&'d str> {
    let table = path.iter().try_fold(dict, |d, key| d.get(key)?.as_dict())?;
    table.get("kind")?.as_str()
}

fn insert(dict: &mut Dict, path: &[String], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let parent = parents.iter().try_fold(dict, |d, key| {
        match d.entry(key.clone()).or_insert_with(|| Dict::new().into()) {
            Value::Dict(_, inner) => Some(inner),
            _ => None,
        }
    });
    if let Some(parent) = parent {
        parent.insert(last.clone(), value);
    }
}

fn remove(dict: &mut Dict, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let parent = parents
        .iter()
        .try_fold(dict, |d, key| match d.get_mut(key) {
            Some(Value::Dict(_, inner)) => Some(inner),
            _ => None,
        });
    if let Some(parent) = parent {
        parent.remove(last);
    }
}

#[cfg(test)]
mod shape_tests {
    use super::*;

    #[test]
    fn hostile_nesting_and_size_are_refused_before_parsing() {
        let deep = "[".repeat(200_000);
        for format in [FileFormat::Yaml, FileFormat::Toml] {
            let Err(err) = parse_layer(format, &deep, "file hostile".into()) else {
                panic!("hostile nesting accepted");
            };
            let err = err.to_string();
            assert!(err.contains("nested") && err.contains("hostile"), "{err}");
        }
        let big = format!("# {}\n", "x".repeat(MAX_CONFIG_BYTES));
        let Err(err) = parse_layer(FileFormat::Toml, &big, "file big".into()) else {
            panic!("an oversized config accepted");
        };
        let err = err.to_string();
        assert!(err.contains("bytes"), "{err}");
    }

    #[test]
    fn brackets_in_strings_and_comments_do_not_count() {
        let nested = "[".repeat(MAX_CONFIG_NESTING + 1);
        let text = format!("a = \"{nested}\" # {nested}\nb = '{nested}'\nc = [[1], [2]]\n");
        assert!(check_shape(&text, "inline").is_ok());
        let too_deep = format!("c = {nested}\n");
        assert!(check_shape(&too_deep, "inline").is_err());
    }
}

#[cfg(test)]
mod tests {
    use figment::Figment;

    use super::*;

    #[test]
    fn values_parse_like_figment_env_plus_exponents() {
        assert_eq!(parse_value("8").to_u128(), Some(8));
        assert_eq!(parse_value("-3").to_i128(), Some(-3));
        assert_eq!(parse_value("0.5").to_f64(), Some(0.5));
        assert_eq!(parse_value("1e-6").to_f64(), Some(1e-6));
        assert_eq!(parse_value("true").to_bool_lossy(), Some(true));
        assert_eq!(parse_value("cuda:0").as_str(), Some("cuda:0"));
        assert_eq!(parse_value("\"8\"").as_str(), Some("8"));
        assert_eq!(parse_value("inf").as_str(), Some("inf"));
        assert!(matches!(parse_value("[1, 2]"), Value::Array(_, a) if a.len() == 2));
    }

    #[test]
    fn bad_keys_are_rejected() {
        let key = |s: &str| s.split('.').map(str::to_owned).collect::<Vec<_>>();
        assert!(Layer::key_value("o".into(), &key("a.b"), "1", "h").is_ok());
        for bad in ["", "a..b", ".a", "a b", "+a"] {
            assert!(
                Layer::key_value("o".into(), &key(bad), "1", "h").is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_kind_switch_drops_the_old_section() {
        let layer = |origin: &str, key: &str, raw: &str| {
            let key: Vec<String> = key.split('.').map(str::to_owned).collect();
            Layer::key_value(origin.into(), &key, raw, "h").expect("valid key")
        };
        let mut layers = vec![
            layer("file", "train.lr_schedule.kind", "cosine"),
            layer("file2", "train.lr_schedule.min_lr_ratio", "0.1"),
            layer("override", "train.lr_schedule.kind", "constant"),
        ];
        apply_kind_switches(&mut layers);
        let figment = layers.into_iter().fold(Figment::new(), |f, l| f.merge(l));
        let table: Dict = figment.extract_inner("train.lr_schedule").expect("table");
        assert_eq!(table.keys().collect::<Vec<_>>(), ["kind"]);
    }
}
