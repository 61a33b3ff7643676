//! Every key of a full config is read by the code that runs, or it is rejected.
//!
//! For each leaf key of the fully resolved example configs (every default written out), the
//! test loads the config again with that key changed and checks that either loading refuses it
//! or the [`RunPlan`] — the settings every component is built from — differs. A key whose change
//! leaves the plan equal would be a key that nothing reads.

use roll::core::config::{Config, ConfigLoader};
use roll::run::RunPlan;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Optional keys the example files leave unset, set here so that the walk covers them too.
const RLVR_EXTRA: &[&str] = &[
    "rollout.sampling.top_k=20",
    "algorithm.dynamic_filter.min_std=0.0",
    "algorithm.token_kl_penalty=\"k1\"",
    "algorithm.objective.kl_loss.coef=0.1",
];

fn leaves(prefix: &str, value: &toml::Value, out: &mut Vec<(String, toml::Value)>) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(&key, v, out);
            }
        }
        leaf => out.push((prefix.to_owned(), leaf.clone())),
    }
}

/// A different value of the same type.
fn perturbed(value: &toml::Value) -> toml::Value {
    use toml::Value as V;
    match value {
        V::Integer(i) => V::Integer(i + 3),
        V::Float(f) => V::Float(if *f == 0.0 { 0.125 } else { f * 0.5 }),
        V::Boolean(b) => V::Boolean(!b),
        V::String(s) => V::String(format!("{s}_changed")),
        V::Array(a) => match a.first() {
            Some(first) => V::Array(vec![perturbed(first)]),
            None => V::Array(vec![V::String("x".into())]),
        },
        other => other.clone(),
    }
}

fn walk(file: &str, extra: &[&str]) {
    let path = format!("{ROOT}/examples/configs/{file}");
    let base = ConfigLoader::new()
        .file(&path)
        .overrides(extra.iter().copied())
        .load()
        .unwrap_or_else(|e| panic!("{file} loads: {e}"));
    let base_plan = RunPlan::from_config(&base).expect("the base plan");
    let resolved: toml::Value = toml::from_str(&base.to_toml().expect("toml")).expect("parse");
    let mut keys = Vec::new();
    leaves("", &resolved, &mut keys);
    assert!(keys.len() > 40, "{file}: only {} keys", keys.len());
    let mut unread = Vec::new();
    for (key, value) in &keys {
        // `[task]` belongs to the program that runs the config: its own type reads it (and
        // denies unknown keys), not the plan.
        if key.starts_with("task.") {
            continue;
        }
        let changed = perturbed(value);
        let loaded: Result<Config, _> = ConfigLoader::new()
            .file(&path)
            .overrides(
                extra
                    .iter()
                    .map(|s| s.to_string())
                    .chain([format!("{key}={changed}")]),
            )
            .load();
        let Ok(config) = loaded else { continue };
        match RunPlan::from_config(&config) {
            Err(_) => {}
            Ok(plan) if plan != base_plan => {}
            Ok(_) => unread.push(format!("{key} = {value} -> {changed}")),
        }
    }
    assert!(
        unread.is_empty(),
        "{file}: keys that change nothing: {unread:#?}"
    );
}

#[test]
fn every_key_of_the_rlvr_config_changes_the_plan_or_is_rejected() {
    walk("rlvr_tiny.toml", RLVR_EXTRA);
}

#[test]
fn every_key_of_the_main_job_config_changes_the_plan_or_is_rejected() {
    walk("rlvr_arithmetic.toml", &[]);
}

#[test]
fn every_key_of_the_multi_domain_config_changes_the_plan_or_is_rejected() {
    walk("rlvr_multi_domain.toml", &[]);
}

#[test]
fn every_key_of_the_agentic_config_changes_the_plan_or_is_rejected() {
    walk("agentic_sokoban.toml", &[]);
}

#[test]
fn every_key_of_the_agentic_example_config_changes_the_plan_or_is_rejected() {
    walk("agentic_frozen_lake.toml", &[]);
}

#[test]
fn combinations_that_cannot_run_are_refused_at_load_naming_the_key() {
    let path = format!("{ROOT}/examples/configs/rlvr_tiny.toml");
    let load = |overrides: &[&str]| {
        ConfigLoader::new()
            .file(&path)
            .overrides(overrides.iter().copied())
            .load()
            .expect_err("refused")
            .to_string()
    };
    let err = load(&["algorithm.advantage.kind=gigpo"]);
    assert!(
        err.contains("algorithm.advantage.kind") && err.contains("agentic"),
        "{err}"
    );
    let err = load(&["algorithm.objective.policy_loss.kind=cross_entropy"]);
    assert!(
        err.contains("algorithm.objective.policy_loss.kind") && err.contains("sft"),
        "{err}"
    );
    let err = load(&["algorithm.advantage.kind=gae"]);
    assert!(
        err.contains("algorithm.advantage.kind") && err.contains("critic"),
        "{err}"
    );
    let err = load(&["algorithm.objective.train_infer_correction.is_weight.upper_bound=1.5"]);
    assert!(
        err.contains("algorithm.objective.train_infer_correction")
            && err.contains("train.recompute_old_logprobs"),
        "{err}"
    );
    // A warm-up as long as the run leaves the cosine schedule nothing to decay over.
    let err = load(&["run.max_steps=2"]);
    assert!(
        err.contains("train.warmup_steps") && err.contains("run.max_steps"),
        "{err}"
    );
    let agentic = format!("{ROOT}/examples/configs/agentic_sokoban.toml");
    let err = ConfigLoader::new()
        .file(&agentic)
        .overrides(["rollout.group_size=4"])
        .load()
        .expect_err("an rlvr key in an agentic run")
        .to_string();
    assert!(
        err.contains("rollout.group_size") && err.contains("agentic.group_size"),
        "{err}"
    );
}
