//! The [`ToolUse`] environment itself.

use super::call::{self, Call};
use super::{CodeSandbox, MathTask, ToolUseConfig, calculator};
use crate::EnvError;
use crate::action::extract_action;
use crate::prompt::TurnPrompt;
use crate::rng::Rng;
use crate::wrappers::{EnvExt, Episodic};
use roll_core::{Env, Observation, StepResult};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

const ANSWER_FORMAT: &str = "Call one tool, or give the final answer as <answer>NUMBER</answer>.";

/// The tool-use environment (registered as `tool_use`): the task's rules in [`Episodic`]
/// wrappers for `max_steps` and `format_penalty`.
#[derive(Debug, Clone)]
pub struct ToolUse {
    env: Episodic<Tools>,
}

/// The rules of the task, without the episode rules the wrappers add.
#[derive(Clone)]
struct Tools {
    config: ToolUseConfig,
    sandbox: Option<Arc<dyn CodeSandbox>>,
    task: Option<MathTask>,
    /// Steps since the reset, for the prompt's turn index and actions left.
    steps: u32,
}

impl fmt::Debug for Tools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tools")
            .field("config", &self.config)
            .field("sandbox", &self.sandbox.is_some())
            .field("task", &self.task)
            .field("steps", &self.steps)
            .finish()
    }
}

impl ToolUse {
    /// An environment with the calculator only; call [`Env::reset`] before stepping.
    ///
    /// # Errors
    /// [`EnvError::InvalidOption`] if an option is out of range.
    pub fn new(config: ToolUseConfig) -> Result<Self, EnvError> {
        config.validate()?;
        let (max_steps, penalty) = (config.max_steps, config.format_penalty);
        let tools = Tools {
            config,
            sandbox: None,
            task: None,
            steps: 0,
        };
        Ok(Self {
            env: tools.episodic("tool_use", max_steps, penalty)?,
        })
    }

    /// Adds the `python[...]` tool, run in `sandbox`.
    #[must_use]
    pub fn with_sandbox(mut self, sandbox: Arc<dyn CodeSandbox>) -> Self {
        self.env.base_mut().sandbox = Some(sandbox);
        self
    }

    /// The current problem.
    pub fn task(&self) -> Option<&MathTask> {
        self.env.base().task.as_ref()
    }
}

impl Env for ToolUse {
    fn reset(&mut self, seed: u64) -> roll_core::Result<Observation> {
        self.env.reset(seed)
    }

    fn step(&mut self, action: &str) -> roll_core::Result<StepResult> {
        self.env.step(action)
    }
}

impl Tools {
    fn instructions(&self) -> String {
        let python = if self.sandbox.is_some() {
            "\n- python[code]: runs Python code and shows what it prints."
        } else {
            ""
        };
        format!(
            "Solve the math problem. You may call a tool; its output is shown to you next turn.\n\
             Tools:\n- calculator[expression]: evaluates + - * / ^ and parentheses.{python}\n\
             When you know the result, answer with <answer>NUMBER</answer>."
        )
    }

    fn prompt(&self, first: bool, feedback: Option<&str>) -> String {
        let question = self.task.as_ref().map_or("", |t| t.question.as_str());
        let instructions = first.then(|| self.instructions());
        TurnPrompt {
            instructions: instructions.as_deref(),
            turn: self.steps + 1,
            feedback,
            observation: &format!("Problem: {question}"),
            actions_left: self.config.max_steps.saturating_sub(self.steps),
            answer_format: ANSWER_FORMAT,
        }
        .render()
    }

    /// Runs a tool call; `None` if the tool is unavailable.
    fn run_tool(&self, call: &Call) -> Result<Option<String>, EnvError> {
        match call {
            Call::Calculator(expr) => Ok(Some(match calculator::evaluate(expr) {
                Ok(v) => format!("calculator output: {}", format_number(v)),
                Err(e) => format!("calculator error: {e}"),
            })),
            Call::Python(code) => {
                let Some(sandbox) = &self.sandbox else {
                    return Ok(None);
                };
                let limit = Duration::try_from_secs_f64(self.config.sandbox_timeout_s)
                    .unwrap_or(Duration::from_secs(5));
                let out = sandbox.run(code, limit).map_err(EnvError::Sandbox)?;
                let mut s = format!("python stdout:\n{}", out.stdout);
                if !out.stderr.is_empty() {
                    s.push_str(&format!("\npython stderr:\n{}", out.stderr));
                }
                if out.timed_out {
                    s.push_str("\n(the program timed out)");
                }
                Ok(Some(s))
            }
            Call::Answer(_) => Ok(None),
        }
    }
}

fn format_number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

impl Env for Tools {
    fn reset(&mut self, seed: u64) -> roll_core::Result<Observation> {
        self.task = Some(MathTask::draw(
            self.config.max_operand,
            &mut Rng::new(seed, 0x7001),
        ));
        self.steps = 0;
        let mut obs = Observation::new(self.prompt(true, None));
        obs.info
            .insert("env_instruction".into(), self.instructions().into());
        Ok(obs)
    }

    /// An unparseable action, or a call to a tool that is not attached, is a no-op with reward
    /// 0, marked invalid.
    fn step(&mut self, action: &str) -> roll_core::Result<StepResult> {
        let Some(answer) = self.task.as_ref().map(|t| t.answer) else {
            // Only reachable before the first reset if used unguarded.
            return Err(EnvError::NotReset {
                env: "tool_use".into(),
            }
            .into());
        };
        self.steps += 1;
        let (step, feedback) = match call::parse(action) {
            Some(Call::Answer(given)) => {
                let correct = (given - answer as f64).abs() < 1e-6;
                let verdict = if correct { "correct" } else { "wrong" };
                let reward = if correct { 1.0 } else { 0.0 };
                (
                    StepResult::terminated(String::new(), reward)
                        .with_action_valid(true)
                        .with_info("success", correct),
                    format!("Your answer is {verdict}."),
                )
            }
            Some(tool) => match self.run_tool(&tool)? {
                Some(output) => (
                    StepResult::running(String::new(), 0.0).with_action_valid(true),
                    output,
                ),
                None => (
                    StepResult::running(String::new(), 0.0).with_action_valid(false),
                    "That tool is not available.".into(),
                ),
            },
            None => (
                StepResult::running(String::new(), 0.0).with_action_valid(false),
                format!(
                    "At turn {}, you did not provide a valid tool call or answer.",
                    self.steps
                ),
            ),
        };
        let mut step = step.with_info("action", extract_action(action));
        step.info.entry("success".into()).or_insert(false.into());
        step.observation = self.prompt(false, Some(&feedback));
        Ok(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_use::SandboxOutput;
    use roll_core::EnvStatus;

    #[test]
    fn calculator_then_answer_earns_the_reward() {
        let mut env = ToolUse::new(ToolUseConfig::default()).unwrap();
        for seed in 0..20 {
            let obs = env.reset(seed).unwrap();
            assert!(obs.text.contains("Problem: ") && !obs.text.contains("python["));
            let task = env.task().unwrap().clone();
            let r = env
                .step(&format!("calculator[{}]", task.expression))
                .unwrap();
            assert_eq!((r.reward, r.status), (0.0, EnvStatus::Running));
            assert!(
                r.observation
                    .contains(&format!("calculator output: {}", task.answer))
            );
            let r = env
                .step(&format!("<answer>{}</answer>", task.answer))
                .unwrap();
            assert_eq!((r.reward, r.status), (1.0, EnvStatus::Terminated));
        }
        env.reset(1).unwrap();
        let r = env.step("<answer>-1</answer>").unwrap();
        assert_eq!((r.reward, r.info["success"].clone()), (0.0, false.into()));
    }

    #[test]
    fn python_needs_a_sandbox_and_sandbox_failures_are_env_errors() {
        let mut env = ToolUse::new(ToolUseConfig {
            format_penalty: -0.1,
            max_steps: 2,
            ..Default::default()
        })
        .unwrap();
        env.reset(0).unwrap();
        let r = env.step("python[print(1)]").unwrap();
        assert_eq!(
            (r.reward, r.info["action_is_valid"].clone()),
            (-0.1, false.into())
        );
        let r = env.step("no idea").unwrap();
        assert_eq!((r.reward, r.status), (-0.1, EnvStatus::Truncated));

        let sandbox = |code: &str, _: Duration| -> Result<SandboxOutput, roll_core::BoxError> {
            if code.contains("boom") {
                return Err("sandbox unreachable".into());
            }
            Ok(SandboxOutput {
                stdout: "1\n".into(),
                exit_code: Some(0),
                ..Default::default()
            })
        };
        let mut env = env.with_sandbox(Arc::new(sandbox));
        assert!(env.reset(0).unwrap().text.contains("python["));
        let r = env.step("python[print(1)]").unwrap();
        assert!(r.observation.contains("python stdout:\n1"));
        assert!(
            env.step("python[boom]")
                .unwrap_err()
                .to_string()
                .contains("unreachable")
        );
    }
}
