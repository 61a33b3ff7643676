//! The config system as a user meets it: files, environment variables, overrides, and the errors
//! that name the key to fix.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use roll_core::Error;
use roll_core::config::{
    ComponentSpec, Config, ConfigLoader, DeviceSpec, LrSchedule, ModelSource, Optimizer, Pipeline,
    PromptFormat,
};

/// The smallest valid config.
const BASE: &str = r#"
[model.source]
kind = "hf_dir"
path = "models/tiny"

[domains.math]
reward = { kind = "math_rule" }
"#;

fn sample(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/configs")
        .join(name)
}

/// A file under the temp dir, removed when dropped.
struct TempFile(PathBuf);

impl std::ops::Deref for TempFile {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<std::path::Path> for TempFile {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        if let Some(dir) = self.0.parent() {
            // Removed only once empty: other tests of this process may still use it.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Writes `text` to a fresh file named `name` under the temp dir.
fn temp_file(name: &str, text: &str) -> TempFile {
    let dir = std::env::temp_dir().join(format!("roll-config-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write temp file");
    TempFile(path)
}

fn load(toml: &str, overrides: &[&str]) -> Result<Config, Error> {
    ConfigLoader::new()
        .toml_str(toml)
        .overrides(overrides.iter().copied())
        .load()
}

fn load_err(toml: &str, overrides: &[&str]) -> Error {
    load(toml, overrides).expect_err("config should be rejected")
}

// ---------------------------------------------------------------------------------------------
// Loading

#[test]
fn toml_and_yaml_samples_give_equal_configs() {
    let toml = Config::from_file(sample("rlvr_tiny.toml")).expect("toml sample");
    let yaml = Config::from_file(sample("rlvr_tiny.yaml")).expect("yaml sample");
    assert_eq!(toml, yaml);
    assert_eq!(toml.rollout.group_size, 8);
    assert_eq!(toml.train.learning_rate, 1e-5);
    assert_eq!(
        toml.train.lr_schedule,
        LrSchedule::Cosine { min_lr_ratio: 0.1 }
    );
    assert_eq!(toml.rollout.sampling.stop, ["\n"]);
    assert_eq!(
        toml.domains["format"].reward,
        ComponentSpec::new("format")
            .with_option("think", "forbidden")
            .with_option("answer", "any")
    );
}

#[test]
fn sample_configs_load_and_validate() {
    for name in ["rlvr_tiny.toml", "rlvr_tiny.yaml", "agentic_sokoban.toml"] {
        let config = Config::from_file(sample(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        config.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let agentic = Config::from_file(sample("agentic_sokoban.toml")).expect("agentic sample");
    assert_eq!(agentic.pipeline, Pipeline::Agentic);
    let settings = agentic.agentic.expect("agentic section");
    assert_eq!(settings.env.kind, "sokoban");
    assert_eq!(settings.env.options["num_boxes"], serde_json::json!(1));
    assert_eq!(settings.format_penalty, -0.15);
}

#[test]
fn a_group_relative_estimator_refuses_groups_of_one() {
    let err = load_err(BASE, &["rollout.group_size=1"]);
    let shown = err.to_string();
    assert!(shown.contains("rollout.group_size"), "{shown}");
    assert!(shown.contains("grpo"), "{shown}");
    let rloo = load_err(
        BASE,
        &["rollout.group_size=1", "algorithm.advantage.kind=rloo"],
    );
    assert!(rloo.to_string().contains("rloo"), "{rloo}");
    // REINFORCE++ normalises over the batch, not the group: a group of one is fine.
    load(
        BASE,
        &[
            "rollout.group_size=1",
            "algorithm.advantage.kind=reinforce_plus_plus",
        ],
    )
    .unwrap();
    load(BASE, &["rollout.group_size=2"]).unwrap();
}

#[test]
fn rl_without_warm_up_after_sft_is_flagged() {
    assert!(load(BASE, &[]).unwrap().cautions().is_empty());
    let sft = format!("{BASE}\n[sft]\nbatch_size = 8\n");
    let cautions = load(&sft, &["train.learning_rate=1e-4"])
        .unwrap()
        .cautions();
    assert_eq!(cautions.len(), 1, "{cautions:?}");
    assert_eq!(cautions[0].key, "train.warmup_steps");
    assert_eq!(cautions[0].value, "0");
    let shown = cautions[0].to_string();
    assert!(shown.contains("0.0001"), "{shown}");
    assert!(
        load(&sft, &["train.warmup_steps=5"])
            .unwrap()
            .cautions()
            .is_empty()
    );
    let main_job = ConfigLoader::new()
        .file(sample("rlvr_arithmetic.toml"))
        .load()
        .unwrap();
    assert!(main_job.cautions().is_empty());
}

#[test]
fn missing_keys_take_their_defaults() {
    let config = load(BASE, &[]).expect("base config");
    assert_eq!(config.pipeline, Pipeline::Rlvr);
    assert_eq!(config.run.seed, 42);
    assert_eq!(config.model.prompt_format, PromptFormat::Chat);
    assert_eq!(config.model.device, DeviceSpec::Cpu);
    assert_eq!(config.rollout.max_staleness, 0);
    assert_eq!(config.rollout.sampling.top_k, None);
    assert_eq!(config.train.optimizer, Optimizer::default());
    assert_eq!(config.train.max_grad_norm, None);
    assert_eq!(config.domains["math"].ratio, 1.0);
    assert!(config.agentic.is_none());
}

#[test]
fn typed_values_are_read() {
    let config = load(
        BASE,
        &[
            "model.device=cuda:1",
            "model.data_parallel=2",
            "model.prompt_format=plain",
            "run.output_dir=runs/a",
            "rollout.sampling.top_k=50",
            "rollout.sampling.stop=[\"</answer>\", \"\\n\"]",
            "train.optimizer.kind=adamw",
        ],
    )
    .expect("valid overrides");
    assert_eq!(config.model.device, DeviceSpec::Cuda(1));
    assert_eq!(
        config.model.trainer_devices(),
        [DeviceSpec::Cuda(1), DeviceSpec::Cuda(2)]
    );
    assert_eq!(config.model.prompt_format, PromptFormat::Plain);
    assert_eq!(config.run.output_dir, std::path::PathBuf::from("runs/a"));
    assert_eq!(config.rollout.sampling.top_k, Some(50));
    assert_eq!(config.rollout.sampling.stop, ["</answer>", "\n"]);
    assert_eq!(config.train.optimizer, Optimizer::default());
}

// ---------------------------------------------------------------------------------------------
// Precedence

#[test]
fn env_overrides_file_and_overrides_override_env() {
    let file = temp_file(
        "precedence.toml",
        &format!("{BASE}\n[rollout]\ngroup_size = 2\n"),
    );
    let env = [("ROLL_ROLLOUT__GROUP_SIZE", "4"), ("HOME", "/ignored")];
    let group_size = |env: &[(&str, &str)], overrides: &[&str]| {
        ConfigLoader::new()
            .file(file.as_path())
            .env_vars(env.iter().copied())
            .overrides(overrides.iter().copied())
            .load()
            .expect("valid")
            .rollout
            .group_size
    };
    assert_eq!(group_size(&[], &[]), 2, "file");
    assert_eq!(group_size(&env, &[]), 4, "env over file");
    assert_eq!(
        group_size(&env, &["rollout.group_size=6"]),
        6,
        "override over env"
    );
    // Call order does not matter: overrides win even when added before the env.
    let config = ConfigLoader::new()
        .overrides(["rollout.group_size=6"])
        .env_vars(env)
        .file(file.as_path())
        .load()
        .expect("valid");
    assert_eq!(config.rollout.group_size, 6);
    // Among overrides (and among env vars) the later wins.
    let both = ["rollout.group_size=6", "rollout.group_size=7"];
    assert_eq!(group_size(&env, &both), 7);
}

#[test]
fn env_vars_parse_like_figment() {
    let config = ConfigLoader::new()
        .toml_str(BASE)
        .env_vars([
            ("ROLL_TRAIN__LEARNING_RATE", "3e-6"),
            ("ROLL_ROLLOUT__SAMPLING__TOP_P", "0.9"),
            ("ROLL_ROLLOUT__SAMPLING__STOP", "[\"a\", \"b\"]"),
            ("ROLL_RUN__NAME", "from-env"),
            ("ROLL_RUN__LOG_EVERY", "5"),
        ])
        .load()
        .expect("valid env");
    assert_eq!(config.train.learning_rate, 3e-6);
    assert_eq!(config.rollout.sampling.top_p, 0.9);
    assert_eq!(config.rollout.sampling.stop, ["a", "b"]);
    assert_eq!(config.run.name, "from-env");
    assert_eq!(config.run.log_every, 5);
}

#[test]
fn switching_kind_replaces_the_section() {
    let file = format!("{BASE}\n[train.lr_schedule]\nkind = \"cosine\"\nmin_lr_ratio = 0.2\n");
    let config = load(&file, &["train.lr_schedule.kind=constant"]).expect("switch");
    assert_eq!(config.train.lr_schedule, LrSchedule::Constant {});
    // The same kind keeps the file's other keys.
    let config = load(&file, &["train.lr_schedule.kind=cosine"]).expect("same kind");
    assert_eq!(
        config.train.lr_schedule,
        LrSchedule::Cosine { min_lr_ratio: 0.2 }
    );
    // A field set without its section's kind keeps the default kind.
    let config = load(BASE, &["train.optimizer.weight_decay=0"]).expect("default kind");
    assert!(
        matches!(config.train.optimizer, Optimizer::AdamW { weight_decay, .. } if weight_decay == 0.0)
    );
    // A kind set on the command line alone starts from the variant's defaults.
    let config = load(BASE, &["train.lr_schedule.kind=cosine"]).expect("new kind");
    assert_eq!(
        config.train.lr_schedule,
        LrSchedule::Cosine { min_lr_ratio: 0.0 }
    );
}

#[test]
fn from_args_reads_config_flag_and_overrides() {
    let file = temp_file(
        "args.yaml",
        "model:\n  source: {kind: hf_dir, path: m}\ndomains:\n  math:\n    reward: {kind: math_rule}\n",
    );
    let path = file.to_string_lossy().into_owned();
    for args in [
        vec!["--config".to_owned(), path.clone()],
        vec!["-c".to_owned(), path.clone()],
        vec![format!("--config={path}")],
    ] {
        let mut args = args;
        args.push("run.max_steps=7".to_owned());
        let config = Config::from_args(args).expect("valid args");
        assert_eq!(config.run.max_steps, 7);
        assert_eq!(config.model.source, ModelSource::HfDir { path: "m".into() });
    }
    let err = Config::from_args(["--print"]).expect_err("unknown flag");
    assert!(err.to_string().contains("`--print`"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Unknown keys

#[test]
fn unknown_nested_key_names_it_suggests_and_gives_file_origin() {
    let file = temp_file("typo.toml", &format!("{BASE}\n[rollout]\ngrop_size = 3\n"));
    let err = ConfigLoader::new()
        .file(file.as_path())
        .load()
        .expect_err("typo");
    let Error::UnknownKey {
        key,
        suggestion,
        origin,
    } = &err
    else {
        panic!("expected UnknownKey, got {err:?}");
    };
    assert_eq!(key, "rollout.grop_size");
    assert_eq!(suggestion.as_deref(), Some("rollout.group_size"));
    assert_eq!(
        origin.as_deref(),
        Some(format!("file {}", file.display()).as_str())
    );
}

#[test]
fn unknown_top_level_key_from_an_override() {
    let err = load_err(BASE, &["rolout.group_size=3"]);
    assert_eq!(
        err.to_string(),
        "unknown config key `rolout`; did you mean `rollout`? (from override rolout.group_size=3)"
    );
    let err = load_err(&format!("banana = 1\n{BASE}"), &[]);
    let Error::UnknownKey {
        key, suggestion, ..
    } = &err
    else {
        panic!("expected UnknownKey, got {err:?}");
    };
    assert_eq!((key.as_str(), suggestion), ("banana", &None));
}

#[test]
fn unknown_key_deeper_and_from_env() {
    let err = ConfigLoader::new()
        .toml_str(BASE)
        .env_vars([("ROLL_ROLLOUT__SAMPLING__TEMPRATURE", "0.5")])
        .load()
        .expect_err("typo");
    assert_eq!(
        err.to_string(),
        "unknown config key `rollout.sampling.temprature`; did you mean \
         `rollout.sampling.temperature`? (from env ROLL_ROLLOUT__SAMPLING__TEMPRATURE)"
    );
}

#[test]
fn unknown_key_inside_a_tagged_enum_names_the_full_key() {
    let toml = format!("{BASE}\n[train.lr_schedule]\nkind = \"cosine\"\nmin_lr_ration = 0.1\n");
    let err = load_err(&toml, &[]);
    let Error::UnknownKey {
        key,
        suggestion,
        origin,
    } = &err
    else {
        panic!("expected UnknownKey, got {err:?}");
    };
    assert_eq!(key, "train.lr_schedule.min_lr_ration");
    assert_eq!(
        suggestion.as_deref(),
        Some("train.lr_schedule.min_lr_ratio")
    );
    assert_eq!(origin.as_deref(), Some("inline TOML"));

    // A key of another variant is unknown in this one, even for a variant without fields.
    let err = load_err(BASE, &["train.lr_schedule.min_lr_ratio=0.1"]);
    assert!(
        matches!(&err, Error::UnknownKey { key, .. } if key == "train.lr_schedule.min_lr_ratio"),
        "{err:?}"
    );
    let err = load_err(BASE, &["train.optimizer.beta3=0.5"]);
    let Error::UnknownKey {
        key, suggestion, ..
    } = &err
    else {
        panic!("expected UnknownKey, got {err:?}");
    };
    assert_eq!(key, "train.optimizer.beta3");
    assert!(
        suggestion
            .as_deref()
            .is_some_and(|s| s.starts_with("train.optimizer.beta"))
    );
}

#[test]
fn roll_key_names_point_to_their_roll_equivalents() {
    let err = load_err(&format!("rollout_batch_size = 64\n{BASE}"), &[]);
    assert!(
        matches!(&err, Error::UnknownKey { suggestion: Some(s), .. } if s == "rollout.prompts_per_step"),
        "{err:?}"
    );
    let err = load_err(BASE, &["train.lr=1e-5"]);
    assert!(
        err.to_string()
            .contains("did you mean `train.learning_rate`?"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// Wrong types, invalid values, unknown kinds, missing keys

#[test]
fn wrong_type_names_key_found_and_expected() {
    let err = load_err(BASE, &["rollout.group_size=eight"]);
    let Error::InvalidType {
        key,
        found,
        expected,
        origin,
    } = &err
    else {
        panic!("expected InvalidType, got {err:?}");
    };
    assert_eq!(key, "rollout.group_size");
    assert!(found.contains("\"eight\""), "{found}");
    assert_eq!(expected, "a non-negative integer");
    assert_eq!(origin.as_deref(), Some("override rollout.group_size=eight"));

    let err = load_err(&format!("{BASE}\n[rollout]\nsampling = 3\n"), &[]);
    assert!(
        matches!(&err, Error::InvalidType { key, expected, .. } if key == "rollout.sampling" && expected == "a table"),
        "{err:?}"
    );
}

#[test]
fn wrong_type_inside_a_tagged_enum_names_the_field() {
    let toml = format!("{BASE}\n[train.lr_schedule]\nkind = \"cosine\"\nmin_lr_ratio = \"low\"\n");
    let err = load_err(&toml, &[]);
    let Error::InvalidType { key, found, .. } = &err else {
        panic!("expected InvalidType, got {err:?}");
    };
    assert_eq!(key, "train.lr_schedule.min_lr_ratio");
    assert!(found.contains("\"low\""), "{found}");

    let err = load_err(BASE, &["train.optimizer.eps=tiny"]);
    assert!(
        matches!(&err, Error::InvalidType { key, origin: Some(o), .. }
            if key == "train.optimizer.eps" && o == "override train.optimizer.eps=tiny"),
        "{err:?}"
    );
}

#[test]
fn out_of_range_values_name_key_value_and_allowed() {
    let cases: &[(&str, &str, &str)] = &[
        ("rollout.group_size=0", "rollout.group_size", "0"),
        (
            "rollout.sampling.temperature=-0.5",
            "rollout.sampling.temperature",
            "-0.5",
        ),
        (
            "rollout.sampling.top_p=1.5",
            "rollout.sampling.top_p",
            "1.5",
        ),
        ("rollout.sampling.top_p=0", "rollout.sampling.top_p", "0"),
        (
            "train.learning_rate=-1e-5",
            "train.learning_rate",
            "-0.00001",
        ),
        ("domains.math.ratio=0", "domains", "ratios summing to 0"),
        ("rollout.group_size=-1", "rollout.group_size", "-1"),
        (
            "train.lr_schedule={kind=\"cosine\", min_lr_ratio=2}",
            "train.lr_schedule.min_lr_ratio",
            "2",
        ),
        ("model.device=gpu", "model.device", "\"gpu\""),
        ("model.data_parallel=0", "model.data_parallel", "0"),
        (
            "rollout.sampling.stop=[\"a\", \"\"]",
            "rollout.sampling.stop.1",
            "\"\"",
        ),
    ];
    for (item, want_key, want_value) in cases {
        let err = load_err(BASE, &[item]);
        let Error::InvalidValue {
            key,
            value,
            allowed,
            origin,
        } = &err
        else {
            panic!("{item}: expected InvalidValue, got {err:?}");
        };
        assert_eq!(key, want_key, "{item}");
        assert_eq!(value, want_value, "{item}");
        assert!(!allowed.is_empty(), "{item}");
        if *want_key != "domains" {
            assert_eq!(origin.as_deref(), Some(format!("override {item}").as_str()));
        }
        assert!(err.to_string().contains(want_key), "{err}");
    }
}

#[test]
fn unknown_kind_lists_the_allowed_kinds() {
    let err = load_err(BASE, &["train.lr_schedule.kind=cosin"]);
    assert_eq!(
        err.to_string(),
        "config key `train.lr_schedule.kind` has an invalid value \"cosin\"; \
         allowed: one of `constant`, `cosine` (from override train.lr_schedule.kind=cosin)"
    );
    let err = load_err(BASE, &["model.prompt_format=raw"]);
    assert!(
        matches!(&err, Error::InvalidValue { key, allowed, .. }
            if key == "model.prompt_format" && allowed == "one of `chat`, `plain`"),
        "{err:?}"
    );
    let err = load_err(BASE, &["pipeline=sft"]);
    assert!(err.to_string().contains("`rlvr`, `agentic`"), "{err}");
}

#[test]
fn missing_required_keys_are_named() {
    let cases: &[(&str, &str)] = &[
        ("", "model.source"),
        ("[model]\nprompt_format = \"plain\"", "model.source"),
        ("[model.source]\nkind = \"hf_dir\"", "model.source.path"),
        ("[model.source]\npath = \"m\"", "model.source.kind"),
        ("[model.source]\nkind = \"hf_dir\"\npath = \"m\"", "domains"),
        (
            "pipeline = \"agentic\"\n[model.source]\nkind = \"hf_dir\"\npath = \"m\"",
            "agentic.env",
        ),
        (
            &format!("{BASE}\n[domains.code]\nratio = 1.0"),
            "domains.code.reward",
        ),
    ];
    for (toml, want) in cases {
        let err = load_err(toml, &[]);
        assert!(
            matches!(&err, Error::MissingKey { key } if key == want),
            "{toml:?}: {err:?}"
        );
    }
}

#[test]
fn source_problems_name_the_source() {
    let missing = PathBuf::from("/definitely/not/here/roll.toml");
    let err = Config::from_file(&missing).expect_err("missing file");
    assert!(
        matches!(&err, Error::Io { path, .. } if *path == missing),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("/definitely/not/here/roll.toml"),
        "{err}"
    );

    let json = temp_file("config.json", "{}");
    let err = Config::from_file(&json).expect_err("json");
    assert!(matches!(&err, Error::ConfigSource { .. }), "{err:?}");
    assert!(
        err.to_string().contains("config.json") && err.to_string().contains(".toml"),
        "{err}"
    );

    let broken = temp_file("broken.toml", "[rollout\ngroup_size = 3");
    let err = Config::from_file(&broken).expect_err("malformed");
    assert!(
        matches!(&err, Error::ConfigSource { origin, .. } if origin.contains("broken.toml")),
        "{err:?}"
    );

    for bad in [
        "rollout.group_size",
        "=3",
        "rollout..group_size=3",
        "+rollout.x=1",
    ] {
        let err = load_err(BASE, &[bad]);
        assert!(
            matches!(&err, Error::ConfigSource { origin, .. } if *origin == format!("override {bad}")),
            "{bad}: {err:?}"
        );
    }
    let err = ConfigLoader::new()
        .toml_str(BASE)
        .env_vars([("ROLL_ROLLOUT_", "3")])
        .load()
        .expect_err("bad env name");
    assert!(err.to_string().contains("env ROLL_ROLLOUT_"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Printing

#[test]
fn to_toml_round_trips() {
    let mut configs = vec![load(BASE, &[]).expect("base")];
    for name in ["rlvr_tiny.toml", "rlvr_tiny.yaml", "agentic_sokoban.toml"] {
        configs.push(Config::from_file(sample(name)).expect("sample"));
    }
    configs.push(
        load(
            BASE,
            &[
                "train.recompute_old_logprobs=true",
                "rollout.sampling.top_k=20",
                "train.max_grad_norm=0.5",
                "domains.math.reward.nested={a=1, b=[true, false]}",
            ],
        )
        .expect("overrides"),
    );
    for config in configs {
        let text = config.to_toml().expect("printable");
        let reloaded = ConfigLoader::new()
            .toml_str(text.as_str())
            .load()
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(reloaded, config, "{text}");
    }
}

#[test]
fn to_toml_shows_every_resolved_key() {
    let text = load(BASE, &[]).expect("base").to_toml().expect("printable");
    for key in [
        "pipeline = \"rlvr\"",
        "seed = 42",
        "group_size = 8",
        "kind = \"adam_w\"",
        "beta2 = 0.999",
    ] {
        assert!(text.contains(key), "{key} missing from:\n{text}");
    }
}

#[test]
fn algorithm_section_is_typed_validated_and_named_in_errors() {
    let toml = format!(
        "{BASE}\n[algorithm.advantage]\nkind = \"grpo\"\nstd_normalize = false\n\
         [algorithm.objective.policy_loss]\nkind = \"ppo\"\nclip_high = 0.28\n"
    );
    let config = load(&toml, &["algorithm.dynamic_filter.min_std=0.0"]).expect("valid algorithm");
    assert!(!config.algorithm.uses_critic());
    // GAE needs a critic, which a config cannot describe: refused at load, naming the key.
    let err = load(&toml, &["algorithm.advantage.kind=gae"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("algorithm.advantage.kind") && err.contains("critic"),
        "{err}"
    );
    assert_eq!(
        config.algorithm.dynamic_filter.and_then(|f| f.min_std),
        Some(0.0)
    );

    let err = load(&toml, &["algorithm.advantage.gamma=1.5"]).unwrap_err();
    match &err {
        Error::InvalidValue { key, value, .. } => {
            assert_eq!(key, "algorithm.advantage.gamma");
            assert_eq!(value, "1.5");
        }
        other => panic!("expected InvalidValue, got {other:?}"),
    }

    let err = load(&toml, &["algorithm.advantage.lamda=0.9"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("algorithm.advantage.lamda"), "{err}");

    let err = load(BASE, &["algorithm.advantage.kind=grpoo"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("algorithm.advantage") && err.contains("grpo"),
        "{err}"
    );

    let err = load(BASE, &["algorithm.objective.policy_loss.clip_low=-0.1"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`algorithm.objective.policy_loss.clip_low`"),
        "{err}"
    );
}

#[test]
fn step_level_estimators_and_the_segment_ratio_need_the_agentic_pipeline() {
    for kind in ["gigpo", "step_reinforce"] {
        let err = load_err(BASE, &[&format!("algorithm.advantage.kind={kind}")]);
        assert!(
            matches!(&err, Error::InvalidValue { key, value, .. }
                if key == "algorithm.advantage.kind" && *value == format!("\"{kind}\"")),
            "{err:?}"
        );
    }
    let err = load_err(BASE, &["algorithm.objective.policy_loss.ratio=segment"]);
    assert!(
        matches!(&err, Error::InvalidValue { key, allowed, .. }
            if key == "algorithm.objective.policy_loss.ratio" && allowed.contains("sequence")),
        "{err:?}"
    );

    // In the agentic pipeline they load, with ROLL's grouping names, and every key is read.
    let agentic = without_table(
        &std::fs::read_to_string(sample("agentic_sokoban.toml")).unwrap(),
        "[algorithm.advantage]",
    );
    let config = load(
        &format!(
            "{agentic}\n[algorithm.advantage]\nkind = \"step_reinforce\"\nstep_reward_gamma = 1.0\n\
             normalization = {{ mean = \"traj_group_id\", std = \"batch\" }}\n\
             [algorithm.objective.policy_loss]\nkind = \"ppo\"\nratio = \"segment\"\n"
        ),
        &[],
    )
    .expect("agentic step_reinforce config");
    assert_eq!(config.algorithm.advantage.name(), "step_reinforce");
    // A reward shaping would normalise the trajectory reward, which step REINFORCE never reads.
    let err = load_err(
        &agentic,
        &[
            "algorithm.advantage.kind=step_reinforce",
            "algorithm.reward_shaping.normalization.mean=group",
        ],
    );
    assert!(
        matches!(&err, Error::InvalidValue { key, allowed, .. }
            if key == "algorithm.reward_shaping" && allowed.contains("advantage.normalization")),
        "{err:?}"
    );
    // An episode acts on many states: GiGPO's episode statistics cannot be taken over one.
    let err = load_err(
        &agentic,
        &[
            "algorithm.advantage.kind=gigpo",
            "algorithm.advantage.episode_normalization.mean=state",
        ],
    );
    assert!(err.to_string().contains("episode_normalization"), "{err}");
}

/// `toml` without the table whose header line starts with `header` (up to the next header).
fn without_table(toml: &str, header: &str) -> String {
    let mut skipping = false;
    let mut out = String::new();
    for line in toml.lines() {
        if line.starts_with('[') {
            skipping = line.starts_with(header);
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[test]
fn colocated_engines_divide_the_experts_as_the_trainers_do() {
    // With rollout ranks, `rollout.expert_parallel` must divide them.
    let err = load_err(BASE, &["rollout.ranks=3", "rollout.expert_parallel=2"]).to_string();
    assert!(
        err.contains("rollout.expert_parallel") && err.contains("rollout.ranks (3)"),
        "{err}"
    );
    // Colocated, the training ranks' engines serve their own trainer's block: the same division.
    let ok = load(
        BASE,
        &["model.expert_parallel=2", "rollout.expert_parallel=2"],
    );
    assert_eq!(ok.expect("the same division").rollout.expert_parallel, 2);
    for overrides in [
        &["rollout.expert_parallel=2"][..],
        &["model.expert_parallel=4", "rollout.expert_parallel=2"],
        &[
            "model.tensor_parallel=2",
            "model.expert_parallel=2",
            "rollout.expert_parallel=2",
        ],
        &[
            "model.pipeline_parallel=2",
            "model.expert_parallel=2",
            "rollout.expert_parallel=2",
        ],
    ] {
        let err = load_err(BASE, overrides).to_string();
        assert!(
            err.contains("rollout.expert_parallel") && err.contains("own trainer's block"),
            "{overrides:?}: {err}"
        );
    }
}
