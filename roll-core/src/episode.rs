//! Playing one multi-turn episode: the bookkeeping that turns an agent–environment conversation
//! into a [`Trajectory`].
//!
//! The trajectory holds the whole conversation as one token sequence: the first observation is the
//! prompt; every assistant turn is appended as generated tokens (trained on) and every
//! environment answer — with the chat-template glue around it — as context tokens (not trained
//! on). Each turn records its weight version and step reward.
//!
//! Template glue is derived by rendering the conversation before and after each message and taking
//! the difference, so any chat template whose renderings extend each other (ChatML, Llama 3, ...)
//! works without template-specific code.

use crate::tokenizer::{ChatMessage, Role, Tokenizer};
use crate::{
    AbortSignal, Env, Error, FinishReason, GenerationRequest, GroupId, Prompt, PromptId, Result,
    SampleId, SamplingParams, Trajectory,
};
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Instant;

/// Limits and sampling of one episode.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeConfig {
    /// Maximum assistant turns; the episode is truncated after them.
    pub max_turns: u32,
    /// Maximum new tokens per turn.
    pub max_tokens_per_turn: u32,
    /// Maximum tokens of the whole conversation; the episode ends when the next turn would not fit.
    pub max_context_tokens: usize,
    /// Sampling parameters. `sampling.seed` is the run seed: each turn's request gets its own
    /// seed derived from it ([`EpisodeIds::turn_seed`]); `None` leaves requests unseeded.
    pub sampling: SamplingParams,
    /// An optional system message before the first observation.
    pub system_prompt: Option<String>,
    /// The domain recorded on the trajectory's prompt (usually the environment's name).
    pub domain: String,
}

impl Default for EpisodeConfig {
    fn default() -> Self {
        Self {
            max_turns: 10,
            max_tokens_per_turn: 128,
            max_context_tokens: 4096,
            sampling: SamplingParams::default(),
            system_prompt: None,
            domain: "env".into(),
        }
    }
}

/// How an episode ended, recorded in the trajectory's `info["episode_end"]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpisodeEnd {
    /// The environment reached a terminal state.
    Terminated,
    /// The environment or the turn limit cut the episode short.
    Truncated,
    /// The conversation no longer fits the context budget.
    ContextFull,
    /// The episode was aborted from outside.
    Aborted,
}

impl EpisodeEnd {
    fn as_str(self) -> &'static str {
        match self {
            Self::Terminated => "terminated",
            Self::Truncated => "truncated",
            Self::ContextFull => "context_full",
            Self::Aborted => "aborted",
        }
    }
}

/// Identifies where an episode sits in a rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpisodeIds {
    /// The trajectory's sample id.
    pub sample: SampleId,
    /// Its group (episodes of one group share the environment seed).
    pub group: GroupId,
    /// The environment seed.
    pub seed: u64,
}

impl EpisodeIds {
    /// The sampling seed of turn `turn` (0-based) of this episode in a run seeded with
    /// `run_seed`:
    ///
    /// `turn_seed = sample_seed(sample_seed(run_seed, group, sample), turn, 0)`
    ///
    /// with [`sample_seed`](crate::scheduler::sample_seed) the splitmix64 finaliser over the xor
    /// of its inputs times odd constants. The inner seed is the episode's own stream: distinct
    /// for every (group, sample) pair of a run, so episodes of one group (which share the
    /// environment seed) still sample differently; the outer mix gives each turn of it a fresh
    /// seed (for a fixed stream, distinct turns give distinct seeds, since multiplying by an odd
    /// constant and the finaliser are both bijections). Nothing depends on timing or completion
    /// order, so the same run seed replays the same requests.
    pub fn turn_seed(&self, run_seed: u64, turn: u32) -> u64 {
        use crate::scheduler::sample_seed;
        let episode = sample_seed(run_seed, self.group.0, self.sample.0);
        sample_seed(episode, u64::from(turn), 0)
    }
}

/// Plays one episode of `env` with `policy` and returns the trajectory: the reward is the sum of
/// step rewards, `info` holds `episode_end`, `episode_score` (that sum), `turns`, `env_s` (the
/// wall time of the environment's `reset` and `step` calls, in seconds: what the environment cost
/// the episode, apart from generation), and `success` when the environment reports one (the
/// `success` info of its last step, as ROLL's environments do).
///
/// # Errors
/// If the environment fails, the policy fails, or the tokenizer cannot render the conversation.
/// An invalid action is not an error (the environment penalises it).
pub async fn play_episode(
    policy: &dyn crate::policy::Generate,
    tokenizer: &dyn Tokenizer,
    env: &mut dyn Env,
    ids: EpisodeIds,
    config: &EpisodeConfig,
    abort: &AbortSignal,
) -> Result<Trajectory> {
    let started = Instant::now();
    let first = env.reset(ids.seed)?;
    let mut env_time = started.elapsed();
    let (mut transcript, prompt_ids) =
        Transcript::start(tokenizer, config.system_prompt.as_deref(), &first.text)?;
    let prompt = Arc::new(Prompt::new(
        PromptId(ids.seed),
        first.text.clone(),
        config.domain.clone(),
    ));
    let mut traj = Trajectory::new(ids.sample, ids.group, prompt, prompt_ids);
    let mut state_key = state_key_of(&first.text, &first.info);
    let mut total = 0.0f32;
    let mut end = EpisodeEnd::Truncated;
    let mut succeeded = None;
    for turn in 0..config.max_turns {
        let used = traj.prompt_ids.len() + traj.response().len();
        let room = config.max_context_tokens.saturating_sub(used);
        let budget = u32::try_from(room)
            .unwrap_or(u32::MAX)
            .min(config.max_tokens_per_turn);
        if budget == 0 {
            end = EpisodeEnd::ContextFull;
            break;
        }
        let mut params = config.sampling.clone();
        params.max_new_tokens = budget;
        params.seed = config.sampling.seed.map(|s| ids.turn_seed(s, turn));
        let mut context = traj.prompt_ids.clone();
        context.extend_from_slice(traj.response().ids());
        let request = GenerationRequest {
            prompt_ids: context,
            params: params.clone(),
            abort: abort.clone(),
        };
        let generation = policy.generate(request).await?;
        if generation.finish_reason == FinishReason::Abort {
            end = EpisodeEnd::Aborted;
            break;
        }
        // The action is the text without trailing stop tokens.
        let mut content_len = generation.token_ids.len();
        while content_len > 0 {
            let t = generation.token_ids[content_len - 1];
            if tokenizer.eos_token_id() == Some(t) || params.stop_token_ids.contains(&t) {
                content_len -= 1;
            } else {
                break;
            }
        }
        let action = tokenizer.decode(&generation.token_ids[..content_len])?;
        let generated_text = tokenizer.decode(&generation.token_ids)?;
        let started = Instant::now();
        let step = env.step(&action)?;
        env_time += started.elapsed();
        total += step.reward;
        if let Some(success) = step
            .info
            .get("success")
            .and_then(serde_json::Value::as_bool)
        {
            succeeded = Some(success);
        }
        let record = traj.push_turn(
            &generation.token_ids,
            &generation.logprobs,
            &generated_text,
            generation.weight_version,
            generation.finish_reason,
        )?;
        record.reward = step.reward;
        record.state_key = Some(state_key);
        state_key = state_key_of(&step.observation, &step.info);
        if step.is_done() {
            end = if step.is_terminated() {
                EpisodeEnd::Terminated
            } else {
                EpisodeEnd::Truncated
            };
            break;
        }
        let glue = transcript.next_turn(&action, &generated_text, &step.observation)?;
        let used = traj.prompt_ids.len() + traj.response().len();
        if used + glue.len() >= config.max_context_tokens {
            // The next observation leaves no room for an answer: the episode ends here, and
            // the trajectory stays within the context the model can score and train on.
            end = EpisodeEnd::ContextFull;
            break;
        }
        traj.push_context(&glue);
    }
    traj.reward = Some(crate::Reward::new(total).with_score(total));
    traj.info.insert("episode_end".into(), end.as_str().into());
    traj.info
        .insert("episode_score".into(), f64::from(total).into());
    traj.info.insert("turns".into(), traj.turns().len().into());
    traj.info
        .insert("env_s".into(), env_time.as_secs_f64().into());
    if let Some(success) = succeeded {
        traj.info.insert("success".into(), success.into());
    }
    if end == EpisodeEnd::Aborted {
        traj.finish_reason = FinishReason::Abort;
    }
    Ok(traj)
}

/// A conversation as the token stream a policy sees, built one message at a time: the prompt
/// (system message and first user message with the generation prompt), then after each
/// assistant turn the *glue* — the template's closing of the assistant message and the next
/// user message with its generation prompt.
///
/// Glue is the difference between renderings of the conversation before and after each message,
/// so any chat template whose renderings extend each other (ChatML, Llama 3, plain
/// concatenation, ...) works without template-specific code. [`play_episode`] and multi-turn
/// SFT ([`SftExample::Conversation`](crate::pipeline::SftExample)) both build their sequences
/// here, which is what makes a warm start's tokens the same as the episodes RL later plays.
pub struct Transcript<'t> {
    tokenizer: &'t dyn Tokenizer,
    messages: Vec<ChatMessage>,
    rendered: String,
}

impl<'t> Transcript<'t> {
    /// A conversation opened by an optional system message and the first user message; returns
    /// it with the prompt's tokens (the rendering with the generation prompt).
    ///
    /// # Errors
    /// If the template cannot render the messages or the tokenizer cannot encode them.
    pub fn start(
        tokenizer: &'t dyn Tokenizer,
        system: Option<&str>,
        first: &str,
    ) -> Result<(Self, Vec<u32>)> {
        let mut messages = Vec::with_capacity(2);
        if let Some(system) = system {
            messages.push(ChatMessage::new(Role::System, system));
        }
        messages.push(ChatMessage::new(Role::User, first));
        let rendered = tokenizer.render_chat(&messages, true)?;
        let prompt_ids = tokenizer.encode(&rendered)?;
        Ok((
            Self {
                tokenizer,
                messages,
                rendered,
            },
            prompt_ids,
        ))
    }

    /// The tokens between an assistant turn and the next one: the assistant said `action` (its
    /// tokens decoded to `generated_text`, which may end in a stop token the template also
    /// writes), then the user (the environment) answered `observation`.
    ///
    /// # Errors
    /// If a rendering does not extend the previous one (a template that rewrites history), or
    /// the tokenizer fails.
    pub fn next_turn(
        &mut self,
        action: &str,
        generated_text: &str,
        observation: &str,
    ) -> Result<Vec<u32>> {
        self.messages
            .push(ChatMessage::new(Role::Assistant, action));
        let with_assistant = self.tokenizer.render_chat(&self.messages, false)?;
        self.messages
            .push(ChatMessage::new(Role::User, observation));
        let with_user = self.tokenizer.render_chat(&self.messages, true)?;
        let assistant_part = suffix_after(&with_assistant, &self.rendered, "assistant message")?;
        let closing = assistant_part
            .strip_prefix(generated_text)
            .or_else(|| assistant_part.strip_prefix(action))
            .unwrap_or("");
        let user_part = suffix_after(&with_user, &with_assistant, "observation")?;
        let glue = self.tokenizer.encode(&format!("{closing}{user_part}"))?;
        self.rendered = with_user;
        Ok(glue)
    }
}

fn suffix_after<'a>(full: &'a str, prefix: &str, what: &str) -> Result<&'a str> {
    full.strip_prefix(prefix).ok_or_else(|| {
        Error::invalid_data(
            "chat template",
            format!("rendering after the {what} does not extend the earlier rendering; multi-turn trajectories need a prefix-stable template"),
        )
    })
}

/// The key of the state an observation shows (GiGPO's anchor state): the hash of the
/// environment's [`STATE_INFO`] when it reports one, else of the observation's text. Text that
/// changes while the state does not — a turn counter, feedback on the last move — would keep
/// equal states apart.
fn state_key_of(text: &str, info: &crate::env::Info) -> u64 {
    match info.get(STATE_INFO).and_then(serde_json::Value::as_str) {
        Some(state) => hash_text(state),
        None => hash_text(text),
    }
}

/// The info key under which an environment may report its state as text (e.g. a grid), for
/// grouping equal states across episodes: turns that acted on equal states form one GiGPO step
/// group. Without it the whole observation text is the state.
pub const STATE_INFO: &str = "state";

fn hash_text(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn ids(group: u64, sample: u64) -> EpisodeIds {
        EpisodeIds {
            sample: SampleId(sample),
            group: GroupId(group),
            seed: 0,
        }
    }

    /// Reports the state `pos` (as text, via STATE_INFO when `report`) and a text with a turn
    /// counter; each action moves by the number it names.
    struct Walk {
        pos: i64,
        turn: u32,
        report: bool,
    }

    impl Walk {
        fn info(&self) -> crate::env::Info {
            let mut info = crate::env::Info::new();
            if self.report {
                info.insert(STATE_INFO.into(), format!("at {}", self.pos).into());
            }
            info
        }
    }

    impl Env for Walk {
        fn reset(&mut self, _seed: u64) -> Result<crate::Observation> {
            (self.pos, self.turn) = (0, 0);
            let mut obs = crate::Observation::new("turn 0, at 0");
            obs.info = self.info();
            Ok(obs)
        }

        fn step(&mut self, action: &str) -> Result<crate::StepResult> {
            self.turn += 1;
            self.pos += action.trim().parse::<i64>().unwrap_or(0);
            let text = format!("turn {}, at {}", self.turn, self.pos);
            let mut step = crate::StepResult::running(text, 0.0);
            step.info = self.info();
            Ok(step)
        }
    }

    async fn state_keys(report: bool, moves: Vec<&'static str>) -> Vec<u64> {
        let config = EpisodeConfig {
            max_turns: moves.len() as u32,
            ..Default::default()
        };
        let policy = crate::testing::ScriptedPolicy::new(moves);
        let mut env = Walk {
            pos: 0,
            turn: 0,
            report,
        };
        let traj = play_episode(
            &policy,
            &crate::testing::ByteTokenizer,
            &mut env,
            ids(0, 0),
            &config,
            &AbortSignal::never(),
        )
        .await
        .unwrap();
        traj.turns().iter().map(|t| t.state_key.unwrap()).collect()
    }

    #[tokio::test]
    async fn equal_reported_states_share_a_key_whatever_the_text_says() {
        // Episode A stands at 0, 1, 2 before its turns; episode B at 0, 2, 1, 2: B's last turn
        // acts on position 2 as A's last does, one turn later (the texts differ: turn 2 vs 3).
        let a = state_keys(true, vec!["1", "1", "1"]).await;
        let b = state_keys(true, vec!["2", "-1", "1", "1"]).await;
        assert_eq!(a[0], b[0], "both start at 0");
        assert_eq!(a[2], b[1], "position 2 at turn 2 and at turn 1");
        assert_eq!(a[2], b[3], "position 2 at turn 2 and at turn 3");
        assert_eq!(a[1], b[2], "position 1");
        assert_ne!(a[1], a[2]);
        // Without a reported state the text is the state: the turn counter keeps them apart.
        let a = state_keys(false, vec!["1", "1", "1"]).await;
        let b = state_keys(false, vec!["2", "-1", "1", "1"]).await;
        assert_eq!(a[0], b[0], "the same first text");
        assert_ne!(a[2], b[3]);
    }

    #[test]
    fn turn_seeds_are_distinct_per_group_episode_and_turn_and_follow_the_formula() {
        let mut seen = HashSet::new();
        for group in 0..4 {
            for sample in 0..8 {
                for turn in 0..10 {
                    assert!(seen.insert(ids(group, sample).turn_seed(42, turn)));
                }
            }
        }
        assert_eq!(seen.len(), 4 * 8 * 10);
        // Hand-unrolled: the episode stream, then the turn.
        let stream = crate::scheduler::sample_seed(42, 3, 5);
        assert_eq!(
            ids(3, 5).turn_seed(42, 2),
            crate::scheduler::sample_seed(stream, 2, 0)
        );
        // The environment seed plays no part; the run seed does.
        let mut other_env = ids(3, 5);
        other_env.seed = 99;
        assert_eq!(other_env.turn_seed(42, 2), ids(3, 5).turn_seed(42, 2));
        assert_ne!(ids(3, 5).turn_seed(43, 2), ids(3, 5).turn_seed(42, 2));
    }
}
