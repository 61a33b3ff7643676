//! "Did you mean ...?" for unknown keys: the closest valid key at the same level, or the roll
//! key for a ROLL (Python) key name.

/// ROLL key names (and common misplacements) and the roll key that means the same. A match here
/// wins over spelling similarity, since it is certain.
const ROLL_KEYS: &[(&str, &str)] = &[
    ("exp_name", "run.name"),
    ("seed", "run.seed"),
    ("max_steps", "run.max_steps"),
    ("output_dir", "run.output_dir"),
    ("save_steps", "run.save_every"),
    ("eval_steps", "run.eval_every"),
    ("logging_steps", "run.log_every"),
    ("resume_from_checkpoint", "run.resume"),
    ("pretrain", "model.source.path"),
    ("model_name_or_path", "model.source.path"),
    ("rollout_batch_size", "rollout.prompts_per_step"),
    ("num_return_sequences_in_group", "rollout.group_size"),
    ("async_generation_ratio", "rollout.max_staleness"),
    (
        "max_additional_running_prompts",
        "rollout.oversample_prompts",
    ),
    ("max_new_tokens", "rollout.max_new_tokens"),
    ("temperature", "rollout.sampling.temperature"),
    ("top_p", "rollout.sampling.top_p"),
    ("top_k", "rollout.sampling.top_k"),
    ("lr", "train.learning_rate"),
    ("learning_rate", "train.learning_rate"),
    ("warmup_steps", "train.warmup_steps"),
    ("lr_scheduler_type", "train.lr_schedule.kind"),
    ("max_grad_norm", "train.max_grad_norm"),
    ("weight_decay", "train.optimizer.weight_decay"),
    ("ppo_epochs", "train.ppo_epochs"),
    ("critic_warmup", "train.critic_warmup"),
    ("domain_interleave_probs", "domains.<name>.ratio"),
    ("tag_included", "domains.<name>.tags"),
    ("rewards", "domains.<name>.reward"),
    ("num_env_groups", "agentic.num_groups"),
    ("max_actions_per_traj", "agentic.max_turns"),
    ("max_tokens_per_step", "agentic.max_tokens_per_turn"),
    ("ratio_type", "algorithm.objective.policy_loss.ratio"),
];

/// How similar (Jaro–Winkler, 0..=1) a valid key must be to be suggested.
const MIN_SIMILARITY: f64 = 0.8;

/// A full dotted key to suggest for the unknown `field` under `parent` (dotted, may be empty),
/// given the `valid` fields at that level.
pub(crate) fn suggest(parent: &str, field: &str, valid: &[&str]) -> Option<String> {
    let join = |name: &str| {
        if parent.is_empty() {
            name.to_owned()
        } else {
            format!("{parent}.{name}")
        }
    };
    let unknown = join(field);
    if let Some((_, target)) = ROLL_KEYS
        .iter()
        .find(|(roll, target)| *roll == field && *target != unknown)
    {
        return Some((*target).to_owned());
    }
    valid
        .iter()
        .map(|candidate| (strsim::jaro_winkler(field, candidate), *candidate))
        .filter(|(score, _)| *score >= MIN_SIMILARITY)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, name)| join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROLLOUT: &[&str] = &[
        "prompts_per_step",
        "group_size",
        "max_new_tokens",
        "max_staleness",
        "oversample_prompts",
        "max_running_requests",
        "sampling",
    ];

    #[test]
    fn close_typos_are_suggested_with_their_full_key() {
        assert_eq!(
            suggest("rollout", "grop_size", ROLLOUT).as_deref(),
            Some("rollout.group_size")
        );
        assert_eq!(
            suggest("rollout", "max_stalenes", ROLLOUT).as_deref(),
            Some("rollout.max_staleness")
        );
        assert_eq!(
            suggest("", "rolout", &["run", "rollout", "train"]).as_deref(),
            Some("rollout")
        );
    }

    #[test]
    fn distant_keys_get_no_suggestion() {
        assert_eq!(suggest("rollout", "banana", ROLLOUT), None);
        assert_eq!(suggest("rollout", "xyz", ROLLOUT), None);
    }

    #[test]
    fn roll_names_map_to_roll_keys() {
        assert_eq!(
            suggest("", "rollout_batch_size", &[]).as_deref(),
            Some("rollout.prompts_per_step")
        );
        assert_eq!(
            suggest("train", "lr", &[]).as_deref(),
            Some("train.learning_rate")
        );
        assert_eq!(
            suggest("rollout", "async_generation_ratio", ROLLOUT).as_deref(),
            Some("rollout.max_staleness")
        );
        assert_eq!(
            suggest("algorithm", "ratio_type", &[]).as_deref(),
            Some("algorithm.objective.policy_loss.ratio")
        );
    }
}
