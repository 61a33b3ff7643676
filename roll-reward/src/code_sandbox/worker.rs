//! [`CodeSandboxWorker`]: runs the response's program against the ground truth's test cases.

use super::config::{CodeSandboxConfig, RewardMode};
use super::extract::extract_code;
use super::harness::{HARNESS, Status, parse_report, random_hex};
use super::sandbox::{Isolation, Limits, Sandbox};
use super::suite::{TestSuite, json_equal, outputs_match};
use super::verdict::{CaseFailure, mismatch, report_failure, run_failure};
use crate::error::RewardError;
use async_trait::async_trait;
use roll_core::{Reward, RewardWorker, Sample};
use serde_json::json;
use std::ffi::OsString;
use std::sync::Arc;
use tokio::sync::OnceCell;

/// How a suite went.
#[derive(Debug, Clone, PartialEq)]
pub struct SuiteOutcome {
    /// Cases that passed.
    pub passed: usize,
    /// Cases in all (for `assert` suites, the top-level asserts the harness counted).
    pub total: usize,
    /// The failed cases, in order: (case index, why).
    pub failures: Vec<(usize, CaseFailure)>,
    /// How the code was isolated.
    pub isolation: Isolation,
}

impl SuiteOutcome {
    /// The reward under `mode`: the fraction passed, or 1 only when all passed.
    pub fn reward(&self, mode: RewardMode) -> f32 {
        match mode {
            RewardMode::Fraction if self.total > 0 => self.passed as f32 / self.total as f32,
            RewardMode::Fraction => 0.0,
            RewardMode::AllPass => f32::from(u8::from(self.passed == self.total && self.total > 0)),
        }
    }
}

/// Runs the model's code against test cases in the [sandbox](super) and rewards the cases
/// passed (registry kind `code_sandbox`).
///
/// The program is [extracted](super::extract_code) from the response; the test cases come from
/// the prompt's ground truth ([`TestSuite`]). Details: `case_type`, `passed` (`k/n`),
/// `isolation`, `code_source`; on failure `reason` (the first failure, e.g.
/// `case 2: timeout: wall clock over 1.000s`) and `failures` (all of them, shortened);
/// `fallback` when running unconfined. A missing or invalid ground truth is an error (the sample
/// is dropped), and so is a sandbox that cannot run ([`RewardError::SandboxUnavailable`],
/// [`RewardError::SandboxFailed`]): the model is never scored 0 for the machine's fault.
///
/// The sandbox is probed once, on first use (or by [`probe`](Self::probe)), and the result is
/// cached. Each call runs its cases one after another on a blocking thread; run calls in
/// parallel through the router's `max_concurrency`.
#[derive(Debug, Clone)]
pub struct CodeSandboxWorker {
    config: CodeSandboxConfig,
    sandbox: Arc<OnceCell<Result<Sandbox, String>>>,
}

impl CodeSandboxWorker {
    /// A worker with `config`; nothing runs until the first score (or [`probe`](Self::probe)).
    ///
    /// # Errors
    /// [`RewardError::InvalidConfig`] naming an option out of range.
    pub fn new(config: CodeSandboxConfig) -> Result<Self, RewardError> {
        config.validate()?;
        Ok(Self {
            config,
            sandbox: Arc::new(OnceCell::new()),
        })
    }

    /// The options.
    pub fn config(&self) -> &CodeSandboxConfig {
        &self.config
    }

    /// Probes the sandbox (once; later calls return the cached answer) and says how code will be
    /// isolated.
    ///
    /// # Errors
    /// [`RewardError::SandboxUnavailable`] saying what is missing; [`RewardError::NoRuntime`]
    /// outside a Tokio runtime.
    pub async fn probe(&self) -> Result<Isolation, RewardError> {
        self.sandbox().await.map(Sandbox::isolation)
    }

    async fn sandbox(&self) -> Result<&Sandbox, RewardError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| RewardError::NoRuntime)?;
        let config = self.config.clone();
        let probed = self
            .sandbox
            .get_or_init(|| async move {
                handle
                    .spawn_blocking(move || Sandbox::probe(&config))
                    .await
                    .unwrap_or_else(|e| Err(format!("the probe task failed: {e}")))
            })
            .await;
        probed
            .as_ref()
            .map_err(|reason| RewardError::SandboxUnavailable {
                reason: reason.clone(),
            })
    }

    /// Runs `code` against `suite`.
    ///
    /// # Errors
    /// [`RewardError::SandboxUnavailable`] / [`RewardError::SandboxFailed`] when the sandbox
    /// cannot run; [`RewardError::InvalidGroundTruth`] for test code that is not Python.
    pub async fn run_suite(
        &self,
        code: &str,
        suite: &TestSuite,
    ) -> Result<SuiteOutcome, RewardError> {
        let sandbox = self.sandbox().await?.clone();
        let (config, code, suite) = (self.config.clone(), code.to_owned(), suite.clone());
        let handle = tokio::runtime::Handle::try_current().map_err(|_| RewardError::NoRuntime)?;
        handle
            .spawn_blocking(move || run_blocking(&sandbox, &config, &code, &suite))
            .await
            .map_err(|e| RewardError::SandboxFailed {
                reason: format!("the sandbox task failed: {e}"),
            })?
    }
}

fn failed(reason: impl Into<String>) -> RewardError {
    RewardError::SandboxFailed {
        reason: reason.into(),
    }
}

fn run_blocking(
    sandbox: &Sandbox,
    config: &CodeSandboxConfig,
    code: &str,
    suite: &TestSuite,
) -> Result<SuiteOutcome, RewardError> {
    let mut outcome = SuiteOutcome {
        passed: 0,
        total: suite.len(),
        failures: Vec::new(),
        isolation: sandbox.isolation(),
    };
    match suite {
        TestSuite::Stdio { cases } => {
            let limits = Limits::for_cases(config, 1);
            for (i, case) in cases.iter().enumerate() {
                if config.reward == RewardMode::AllPass && !outcome.failures.is_empty() {
                    outcome.failures.push((i, CaseFailure::NotRun));
                    continue;
                }
                let staging = sandbox
                    .stage(&[("solution.py", code.as_bytes())])
                    .map_err(|e| failed(format!("cannot create the run directory: {e}")))?;
                let args = vec![
                    OsString::from("-I"),
                    "-B".into(),
                    staging.path("solution.py").into(),
                ];
                let out = sandbox
                    .run(&staging, &args, case.input.clone().into_bytes(), &limits)
                    .map_err(failed)?;
                let failure = run_failure(&out, limits.wall, limits.output_bytes).or_else(|| {
                    let got = String::from_utf8_lossy(&out.stdout);
                    (!outputs_match(&got, &case.output))
                        .then(|| CaseFailure::WrongAnswer(mismatch(&case.output, &got)))
                });
                match failure {
                    None => outcome.passed += 1,
                    Some(f) => outcome.failures.push((i, f)),
                }
            }
        }
        TestSuite::Assert { .. } | TestSuite::Call { .. } => {
            run_harness(sandbox, config, code, suite, &mut outcome)?;
        }
    }
    Ok(outcome)
}

fn run_harness(
    sandbox: &Sandbox,
    config: &CodeSandboxConfig,
    code: &str,
    suite: &TestSuite,
    outcome: &mut SuiteOutcome,
) -> Result<(), RewardError> {
    let per_case = config.time_limit().unwrap_or_default();
    let nonce = random_hex();
    // The spec names the solution's path, so it is written once the staging directory exists.
    let staging = sandbox
        .stage(&[
            ("solution.py", code.as_bytes()),
            ("harness.py", HARNESS.as_bytes()),
        ])
        .map_err(|e| failed(format!("cannot create the run directory: {e}")))?;
    let solution = staging.path("solution.py");
    let mut spec = json!({
        "kind": suite.kind(),
        "solution": solution.to_string_lossy(),
        "time_limit": per_case.as_secs_f64(),
    });
    match suite {
        TestSuite::Assert { test_code } => spec["test_code"] = json!(test_code),
        TestSuite::Call {
            entry_point, cases, ..
        } => {
            spec["entry_point"] = json!(entry_point);
            spec["calls"] = cases
                .iter()
                .map(|c| json!({"args": c.args, "kwargs": c.kwargs}))
                .collect();
        }
        TestSuite::Stdio { .. } => {}
    }
    staging
        .add("spec.json", spec.to_string().as_bytes())
        .map_err(|e| failed(format!("cannot write the test spec: {e}")))?;
    let spec_path = staging.path("spec.json");
    let limits = Limits::for_cases(config, suite.len() + 1);
    let args = vec![
        OsString::from("-I"),
        "-B".into(),
        staging.path("harness.py").into(),
        spec_path.into(),
    ];
    let out = sandbox
        .run(&staging, &args, format!("{nonce}\n").into_bytes(), &limits)
        .map_err(failed)?;
    let report = parse_report(&out.stdout, &nonce);
    if let Some(e) = report.bad_tests {
        return Err(RewardError::InvalidGroundTruth {
            worker: "code_sandbox",
            reason: format!("`test_code` is not valid Python: {e}"),
        });
    }
    if let TestSuite::Assert { .. } = suite {
        outcome.total = report.total.unwrap_or(1).max(1);
    }
    let ended = run_failure(&out, limits.wall, limits.output_bytes);
    let stopped = report
        .load
        .as_ref()
        .or(report.setup.as_ref())
        .map(|r| report_failure(r, per_case).unwrap_or(CaseFailure::NotRun));
    let mut missing_reported = false;
    for i in 0..outcome.total {
        let failure = match report.cases.get(&i) {
            Some(r) => match (&r.status, suite) {
                (Status::Ok, TestSuite::Call { cases, .. }) => {
                    let got = r.result.clone().unwrap_or_default();
                    cases
                        .get(i)
                        .filter(|c| !json_equal(&got, &c.expected))
                        .map(|c| {
                            CaseFailure::WrongAnswer(mismatch(
                                &c.expected.to_string(),
                                &got.to_string(),
                            ))
                        })
                }
                _ => report_failure(r, per_case),
            },
            None => match &stopped {
                Some(f) => Some(f.clone()),
                None if !missing_reported => {
                    missing_reported = true;
                    Some(ended.clone().unwrap_or_else(|| {
                        CaseFailure::RuntimeError("the test harness stopped early".into())
                    }))
                }
                None => Some(CaseFailure::NotRun),
            },
        };
        match failure {
            None => outcome.passed += 1,
            Some(f) => outcome.failures.push((i, f)),
        }
    }
    Ok(())
}

/// At most this many failures are listed in the `failures` detail.
const MAX_LISTED_FAILURES: usize = 10;

#[async_trait]
impl RewardWorker for CodeSandboxWorker {
    async fn score(&self, sample: &Sample) -> roll_core::Result<Reward> {
        let truth = sample.prompt.ground_truth.as_deref().ok_or_else(|| {
            RewardError::MissingGroundTruth {
                worker: "code_sandbox",
                prompt: sample.prompt.id.to_string(),
            }
        })?;
        let suite = TestSuite::parse(truth)?;
        let Some((code, source)) = extract_code(&sample.text) else {
            return Ok(Reward::new(0.0)
                .with_score(0.0)
                .with_detail("case_type", suite.kind())
                .with_detail("passed", format!("0/{}", suite.len()))
                .with_detail("reason", "no code in the response (after the think block)"));
        };
        let outcome = self.run_suite(&code, &suite).await?;
        let value = outcome.reward(self.config.reward);
        let mut reward = Reward::new(value)
            .with_score(value)
            .with_detail("case_type", suite.kind())
            .with_detail("passed", format!("{}/{}", outcome.passed, outcome.total))
            .with_detail("isolation", outcome.isolation.as_str())
            .with_detail("code_source", source.as_str());
        if let Some((i, f)) = outcome.failures.first() {
            reward = reward.with_detail("reason", format!("case {i}: {f}"));
            let mut listed: Vec<String> = outcome
                .failures
                .iter()
                .take(MAX_LISTED_FAILURES)
                .map(|(i, f)| format!("case {i}: {f}"))
                .collect();
            if outcome.failures.len() > MAX_LISTED_FAILURES {
                listed.push(format!(
                    "and {} more",
                    outcome.failures.len() - MAX_LISTED_FAILURES
                ));
            }
            reward = reward.with_detail("failures", listed.join("; "));
        }
        if let Ok(sandbox) = self.sandbox().await
            && let Some(why) = &sandbox.fallback_reason
        {
            reward = reward.with_detail("fallback", why.clone());
        }
        Ok(reward)
    }
}
