//! The three domains' tasks, each checked by its own roll-reward worker:
//!
//! * **math** — `Q: 23+45=? A:` answered ` 68` (the math verifier reads the whole answer);
//! * **code** — `Write g(n) that returns n times 3 plus 1.` answered
//!   `def g(n): return n*3+1` (the code sandbox calls `g` on five inputs);
//! * **ifeval** — `Write about cats in capital letters only.` answered
//!   `CATS SLEEP IN THE SUN.` (the IFEval rule named in the ground truth).
//!
//! Each domain's held-out problems are drawn first and kept out of everything trained on. The
//! warm start mixes an expert, always right, with a novice who makes one systematic mistake per
//! domain (a forgotten carry; `-` for `+` and `%` for `//`; an ignored instruction): the
//! warm-started policy knows each task's form but not always the right answer, which is what RL
//! then learns from the domains' verifiers.

use roll::core::rng::{SplitMix64, derive_seed};
use roll::prelude::*;
use serde::Deserialize;
use serde_json::json;
use std::collections::HashSet;
use std::hash::Hash;

/// `[task]` of the config: every key is read here (unknown keys are refused).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// Held-out prompts per domain (never trained on, by SFT or RL).
    pub held_out: usize,
    /// `[task.math]`.
    pub math: Math,
    /// `[task.code]`.
    pub code: Code,
    /// `[task.ifeval]`.
    pub ifeval: IfEval,
}

/// What the three domains' sections have in common.
#[derive(Debug, Clone, Copy)]
struct Amounts {
    sft_examples: usize,
    novice_share: f64,
    rl_prompts: usize,
}

/// `[task.math]`: sums and differences.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Math {
    /// Operators drawn from: `+` and `-`.
    pub operators: Vec<char>,
    /// Operands are drawn from `0..=max_operand`.
    pub max_operand: u64,
    /// SFT pairs of this domain (the domains' pairs are interleaved).
    pub sft_examples: usize,
    /// Share of those pairs the novice answers, in `[0, 1]`.
    pub novice_share: f64,
    /// RL prompts of this domain (the run cycles through them).
    pub rl_prompts: usize,
}

/// `[task.code]`: one-line Python functions of one integer.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Code {
    /// Constants are drawn from `1..=max_constant` (multipliers and divisors from 2), in 2..=99.
    pub max_constant: u64,
    /// SFT pairs of this domain (the domains' pairs are interleaved).
    pub sft_examples: usize,
    /// Share of those pairs the novice answers, in `[0, 1]`.
    pub novice_share: f64,
    /// RL prompts of this domain (the run cycles through them).
    pub rl_prompts: usize,
}

/// `[task.ifeval]`: a sentence about a topic under one instruction.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IfEval {
    /// SFT pairs of this domain (the domains' pairs are interleaved).
    pub sft_examples: usize,
    /// Share of those pairs the novice answers, in `[0, 1]`.
    pub novice_share: f64,
    /// RL prompts of this domain (the run cycles through them).
    pub rl_prompts: usize,
}

/// The task's datasets, drawn from the run seed.
pub struct Datasets {
    /// Held-out prompts of every domain, with their ground truths.
    pub held_out: Vec<Prompt>,
    /// The expert's answer to each held-out prompt, in the same order.
    pub held_out_answers: Vec<String>,
    /// SFT pairs of every domain, interleaved.
    pub sft: Vec<SftExample>,
    /// The expert's answers to the first held-out prompts of each domain: the SFT stage's
    /// held-out loss.
    pub sft_held_out: Vec<SftExample>,
    /// RL prompts of every domain; the run mixes them by `[domains]` ratio.
    pub rl: Vec<Prompt>,
}

/// Held-out pairs per domain for the SFT stage's held-out loss.
const SFT_HELD_OUT: usize = 32;

impl Task {
    /// Checks the settings, naming the key at fault.
    pub fn validate(&self) -> anyhow::Result<()> {
        let m = &self.math;
        anyhow::ensure!(
            !m.operators.is_empty() && m.operators.iter().all(|o| "+-".contains(*o)),
            "task.math.operators: {:?} must be a non-empty list of \"+\" and \"-\"",
            m.operators
        );
        anyhow::ensure!(
            (1..=9999).contains(&m.max_operand),
            "task.math.max_operand: {} must be in 1..=9999",
            m.max_operand
        );
        anyhow::ensure!(
            (2..=99).contains(&self.code.max_constant),
            "task.code.max_constant: {} must be in 2..=99",
            self.code.max_constant
        );
        anyhow::ensure!(self.held_out >= 1, "task.held_out must be at least 1");
        for (name, amounts, space) in self.amounts() {
            anyhow::ensure!(
                (0.0..=1.0).contains(&amounts.novice_share),
                "task.{name}.novice_share: {} must be in [0, 1]",
                amounts.novice_share
            );
            anyhow::ensure!(
                amounts.rl_prompts >= 1,
                "task.{name}.rl_prompts must be at least 1"
            );
            anyhow::ensure!(
                self.held_out * 2 <= space,
                "task.held_out: {} is more than half of the {space} distinct {name} problems",
                self.held_out
            );
        }
        Ok(())
    }

    /// Draws the datasets: each domain's held-out problems first, then its SFT and RL problems
    /// from the rest of its space.
    pub fn datasets(&self, run_seed: u64) -> Datasets {
        let mut rng = SplitMix64::new(derive_seed(run_seed, "task"));
        let [(_, math, _), (_, code, _), (_, ifeval, _)] = self.amounts();
        let domains = [
            self.domain(&mut rng, math, |r| MathProblem::draw(r, &self.math)),
            self.domain(&mut rng, code, |r| CodeProblem::draw(r, &self.code)),
            self.domain(&mut rng, ifeval, IfEvalProblem::draw),
        ];
        let mut data = Datasets {
            held_out: Vec::new(),
            held_out_answers: Vec::new(),
            sft: Vec::new(),
            sft_held_out: Vec::new(),
            rl: Vec::new(),
        };
        // Prompt ids are unique over the whole run: they seed each prompt's samples.
        let mut id = 0;
        let mut next = |p: &Drawn| {
            id += 1;
            p.prompt(PromptId(id - 1))
        };
        let mut sft = Vec::new();
        for d in &domains {
            data.held_out.extend(d.held_out.iter().map(&mut next));
            let answers = d.held_out.iter().map(|p| p.expert.clone());
            data.held_out_answers.extend(answers);
            let pairs = d.held_out.iter().take(SFT_HELD_OUT);
            data.sft_held_out.extend(pairs.map(|p| p.pair(&p.expert)));
            sft.push(d.sft.iter().map(|(p, r)| p.pair(r)).collect::<Vec<_>>());
        }
        for d in &domains {
            data.rl.extend(d.rl.iter().map(&mut next));
        }
        data.sft = interleave(sft, &mut rng);
        data
    }

    /// Each domain's name, amounts and number of distinct problems.
    fn amounts(&self) -> [(&'static str, Amounts, usize); 3] {
        let (m, c, i) = (&self.math, &self.code, &self.ifeval);
        [
            (
                MathProblem::DOMAIN,
                Amounts {
                    sft_examples: m.sft_examples,
                    novice_share: m.novice_share,
                    rl_prompts: m.rl_prompts,
                },
                MathProblem::space(m),
            ),
            (
                CodeProblem::DOMAIN,
                Amounts {
                    sft_examples: c.sft_examples,
                    novice_share: c.novice_share,
                    rl_prompts: c.rl_prompts,
                },
                CodeProblem::space(c),
            ),
            (
                IfEvalProblem::DOMAIN,
                Amounts {
                    sft_examples: i.sft_examples,
                    novice_share: i.novice_share,
                    rl_prompts: i.rl_prompts,
                },
                IfEvalProblem::space(),
            ),
        ]
    }

    /// One domain's problems: `held_out` distinct ones, then SFT pairs (the novice's share by
    /// the novice) and RL problems, none of them held out.
    fn domain<P: Problem>(
        &self,
        rng: &mut SplitMix64,
        amounts: Amounts,
        mut draw: impl FnMut(&mut SplitMix64) -> P,
    ) -> DomainData {
        let mut held: HashSet<P> = HashSet::new();
        let mut held_out = Vec::with_capacity(self.held_out);
        while held_out.len() < self.held_out {
            let p = draw(rng);
            if held.insert(p) {
                held_out.push(Drawn::of(&p));
            }
        }
        let mut fresh = |rng: &mut SplitMix64| loop {
            let p = draw(rng);
            if !held.contains(&p) {
                return p;
            }
        };
        let mut sft = Vec::with_capacity(amounts.sft_examples);
        for _ in 0..amounts.sft_examples {
            let p = fresh(rng);
            let novice = rng.next_f64() < amounts.novice_share;
            let response = if novice { p.novice() } else { p.expert() };
            sft.push((Drawn::of(&p), response));
        }
        let rl = (0..amounts.rl_prompts)
            .map(|_| Drawn::of(&fresh(rng)))
            .collect();
        DomainData { held_out, sft, rl }
    }
}

/// The lists of several domains as one, in random order: each next pair comes from a domain
/// with probability proportional to what it has left, so the mix is even over the whole stage
/// whatever `sft.shuffle` says.
fn interleave(lists: Vec<Vec<SftExample>>, rng: &mut SplitMix64) -> Vec<SftExample> {
    let total: usize = lists.iter().map(Vec::len).sum();
    let mut lists: Vec<std::vec::IntoIter<SftExample>> =
        lists.into_iter().map(Vec::into_iter).collect();
    let mut out = Vec::with_capacity(total);
    for left in (1..=total).rev() {
        let mut pick = (rng.next_u64() % left as u64) as usize;
        for list in &mut lists {
            if pick < list.len() {
                out.extend(list.next());
                break;
            }
            pick -= list.len();
        }
    }
    out
}

/// A domain's drawn problems, as text.
struct DomainData {
    held_out: Vec<Drawn>,
    sft: Vec<(Drawn, String)>,
    rl: Vec<Drawn>,
}

/// A problem of any domain, rendered.
struct Drawn {
    domain: &'static str,
    text: String,
    truth: String,
    expert: String,
}

impl Drawn {
    fn of<P: Problem>(p: &P) -> Self {
        Self {
            domain: P::DOMAIN,
            text: p.prompt(),
            truth: p.ground_truth(),
            expert: p.expert(),
        }
    }

    fn prompt(&self, id: PromptId) -> Prompt {
        Prompt::new(id, self.text.clone(), self.domain).with_ground_truth(self.truth.clone())
    }

    fn pair(&self, response: &str) -> SftExample {
        SftExample::new(self.text.clone(), response)
    }
}

/// One problem of a domain: its prompt, the ground truth its reward worker reads, and two
/// answers.
trait Problem: Copy + Eq + Hash {
    /// The domain (and the prompts' tag).
    const DOMAIN: &'static str;
    /// The prompt text.
    fn prompt(&self) -> String;
    /// The ground truth, in the format of the domain's reward worker.
    fn ground_truth(&self) -> String;
    /// The right answer.
    fn expert(&self) -> String;
    /// A plausible wrong answer.
    fn novice(&self) -> String;
}

/// `a op b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct MathProblem {
    a: u64,
    op: char,
    b: u64,
}

impl MathProblem {
    fn draw(rng: &mut SplitMix64, task: &Math) -> Self {
        let n = task.max_operand + 1;
        Self {
            a: rng.next_u64() % n,
            op: task.operators[(rng.next_u64() % task.operators.len() as u64) as usize],
            b: rng.next_u64() % n,
        }
    }

    fn space(task: &Math) -> usize {
        let n = task.max_operand as usize + 1;
        task.operators.len() * n * n
    }

    fn value(self) -> i64 {
        let (a, b) = (self.a as i64, self.b as i64);
        if self.op == '+' { a + b } else { a - b }
    }
}

impl Problem for MathProblem {
    const DOMAIN: &'static str = "math";

    fn prompt(&self) -> String {
        format!("Q: {}{}{}=? A:", self.a, self.op, self.b)
    }

    fn ground_truth(&self) -> String {
        self.value().to_string()
    }

    fn expert(&self) -> String {
        format!(" {}", self.value())
    }

    /// Digit by digit with no carry (a sum) or no borrow (a difference: each digit's distance).
    fn novice(&self) -> String {
        let (big, small, sign) = match self.op {
            '+' => (self.a, self.b, ""),
            _ if self.a >= self.b => (self.a, self.b, ""),
            _ => (self.b, self.a, "-"),
        };
        let (mut x, mut y, mut place, mut out) = (big, small, 1, 0);
        while x > 0 || y > 0 {
            let (p, q) = (x % 10, y % 10);
            let digit = if self.op == '+' {
                (p + q) % 10
            } else {
                p.abs_diff(q)
            };
            out += digit * place;
            (x, y, place) = (x / 10, y / 10, place * 10);
        }
        format!(" {sign}{out}")
    }
}

/// The function's shape; `a` and `b` are its constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Shape {
    /// `x*a+b`
    MulAdd,
    /// `x*a-b`
    MulSub,
    /// `x*x+b`
    SquareAdd,
    /// `(x+a)*b`
    AddMul,
    /// `x//a`
    FloorDiv,
    /// `x%a`
    Mod,
}

const SHAPES: [Shape; 6] = [
    Shape::MulAdd,
    Shape::MulSub,
    Shape::SquareAdd,
    Shape::AddMul,
    Shape::FloorDiv,
    Shape::Mod,
];
/// Function and argument names: the prompt must be read for both.
const NAMES: [&str; 3] = ["f", "g", "h"];
const ARGS: [&str; 3] = ["x", "n", "k"];
/// The inputs each function is called with.
const INPUTS: [i64; 5] = [0, 1, 3, 7, 10];

/// `def name(arg): return ...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct CodeProblem {
    name: usize,
    arg: usize,
    shape: Shape,
    a: u64,
    b: u64,
}

impl CodeProblem {
    fn draw(rng: &mut SplitMix64, task: &Code) -> Self {
        let mut pick = |n: u64| rng.next_u64() % n;
        let (name, arg) = (pick(3) as usize, pick(3) as usize);
        let shape = SHAPES[pick(SHAPES.len() as u64) as usize];
        let m = task.max_constant;
        // Multipliers and divisors from 2 (a 1 or 0 would make the constant pointless or the
        // function fail); a constant a shape does not use is 0, so equal problems hash equal.
        let (a, b) = match shape {
            Shape::MulAdd | Shape::MulSub => (2 + pick(m - 1), 1 + pick(m)),
            Shape::SquareAdd => (0, 1 + pick(m)),
            Shape::AddMul => (1 + pick(m), 2 + pick(m - 1)),
            Shape::FloorDiv | Shape::Mod => (2 + pick(m - 1), 0),
        };
        Self {
            name,
            arg,
            shape,
            a,
            b,
        }
    }

    fn space(task: &Code) -> usize {
        let m = task.max_constant as usize;
        let per_name = 3 * (m - 1) * m + m + 2 * (m - 1);
        NAMES.len() * ARGS.len() * per_name
    }

    /// The body's expression and the prompt's words for it; `swap` writes `-` for `+`, `%` for
    /// `//`, and the other way round (the novice's mistake).
    fn expression(&self, swap: bool) -> (String, String) {
        let (x, a, b) = (ARGS[self.arg], self.a, self.b);
        let (plus, minus, div, rem) = match swap {
            false => ("+", "-", "//", "%"),
            true => ("-", "+", "%", "//"),
        };
        match self.shape {
            Shape::MulAdd => (
                format!("{x}*{a}{plus}{b}"),
                format!("{x} times {a} plus {b}"),
            ),
            Shape::MulSub => (
                format!("{x}*{a}{minus}{b}"),
                format!("{x} times {a} minus {b}"),
            ),
            Shape::SquareAdd => (format!("{x}*{x}{plus}{b}"), format!("{x} squared plus {b}")),
            Shape::AddMul => (
                format!("({x}{plus}{a})*{b}"),
                format!("{x} plus {a}, times {b}"),
            ),
            Shape::FloorDiv => (
                format!("{x}{div}{a}"),
                format!("{x} divided by {a}, rounded down"),
            ),
            Shape::Mod => (
                format!("{x}{rem}{a}"),
                format!("the remainder of {x} by {a}"),
            ),
        }
    }

    fn value(&self, x: i64) -> i64 {
        let (a, b) = (self.a as i64, self.b as i64);
        match self.shape {
            Shape::MulAdd => x * a + b,
            Shape::MulSub => x * a - b,
            Shape::SquareAdd => x * x + b,
            Shape::AddMul => (x + a) * b,
            Shape::FloorDiv => x.div_euclid(a),
            Shape::Mod => x.rem_euclid(a),
        }
    }

    fn def(&self, body: &str) -> String {
        format!(
            "def {}({}): return {body}",
            NAMES[self.name], ARGS[self.arg]
        )
    }
}

impl Problem for CodeProblem {
    const DOMAIN: &'static str = "code";

    fn prompt(&self) -> String {
        let (_, words) = self.expression(false);
        let (name, arg) = (NAMES[self.name], ARGS[self.arg]);
        format!("Write {name}({arg}) that returns {words}.\n")
    }

    fn ground_truth(&self) -> String {
        let cases: Vec<_> = INPUTS
            .iter()
            .map(|&x| json!({"args": [x], "expected": self.value(x)}))
            .collect();
        json!({"type": "call", "entry_point": NAMES[self.name], "cases": cases}).to_string()
    }

    fn expert(&self) -> String {
        self.def(&self.expression(false).0)
    }

    /// Confuses `+` with `-` and `//` with `%`.
    fn novice(&self) -> String {
        self.def(&self.expression(true).0)
    }
}

/// A topic and the sentence the expert writes about it.
const TOPICS: [(&str, &str); 16] = [
    ("the sea", "The sea is deep and blue."),
    ("cats", "Cats sleep in the sun."),
    ("the moon", "The moon shines at night."),
    ("rain", "Rain falls on the roof."),
    ("bread", "Bread is warm and soft."),
    ("music", "Music makes us dance."),
    ("trees", "Trees grow tall and green."),
    ("snow", "Snow covers the hills."),
    ("birds", "Birds sing in the morning."),
    ("rivers", "Rivers run to the sea."),
    ("books", "Books hold many stories."),
    ("dogs", "Dogs love to run."),
    ("the wind", "The wind blows hard."),
    ("flowers", "Flowers bloom in spring."),
    ("coffee", "Coffee wakes me up."),
    ("winter", "Winter days are short."),
];
/// Words the response must end with (`validate_end`).
const END_WORDS: [&str; 8] = [
    "today", "again", "now", "here", "too", "forever", "always", "tonight",
];
/// Words the response must use (`verify_keywords`).
const KEYWORDS: [&str; 8] = [
    "quiet", "bright", "old", "gentle", "wild", "small", "golden", "happy",
];

/// One IFEval instruction; the index picks its word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Rule {
    Lowercase,
    Uppercase,
    Quoted,
    Title,
    EndWith(usize),
    Keyword(usize),
}

/// "Write about `topic` ..." under one rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct IfEvalProblem {
    topic: usize,
    rule: Rule,
}

impl IfEvalProblem {
    fn draw(rng: &mut SplitMix64) -> Self {
        let topic = (rng.next_u64() % TOPICS.len() as u64) as usize;
        let word = (rng.next_u64() % 8) as usize;
        let rule = match rng.next_u64() % 6 {
            0 => Rule::Lowercase,
            1 => Rule::Uppercase,
            2 => Rule::Quoted,
            3 => Rule::Title,
            4 => Rule::EndWith(word),
            _ => Rule::Keyword(word),
        };
        Self { topic, rule }
    }

    fn space() -> usize {
        TOPICS.len() * (4 + END_WORDS.len() + KEYWORDS.len())
    }
}

impl Problem for IfEvalProblem {
    const DOMAIN: &'static str = "ifeval";

    fn prompt(&self) -> String {
        let how = match self.rule {
            Rule::Lowercase => "in lowercase letters only".to_owned(),
            Rule::Uppercase => "in capital letters only".to_owned(),
            Rule::Quoted => "in double quotes".to_owned(),
            Rule::Title => "with a <<title>>".to_owned(),
            Rule::EndWith(w) => format!("and end with the word {}", END_WORDS[w]),
            Rule::Keyword(w) => format!("and use the word {}", KEYWORDS[w]),
        };
        format!("Write about {} {how}.\n", TOPICS[self.topic].0)
    }

    fn ground_truth(&self) -> String {
        match self.rule {
            Rule::Lowercase => json!({"func_name": "validate_lowercase"}),
            Rule::Uppercase => json!({"func_name": "validate_uppercase"}),
            Rule::Quoted => json!({"func_name": "validate_quotation"}),
            Rule::Title => json!({"func_name": "validate_title"}),
            Rule::EndWith(w) => json!({"func_name": "validate_end", "end_phrase": END_WORDS[w]}),
            Rule::Keyword(w) => {
                json!({"func_name": "verify_keywords", "keyword_list": [KEYWORDS[w]]})
            }
        }
        .to_string()
    }

    fn expert(&self) -> String {
        let (topic, sentence) = TOPICS[self.topic];
        match self.rule {
            Rule::Lowercase => sentence.to_lowercase(),
            Rule::Uppercase => sentence.to_uppercase(),
            Rule::Quoted => format!("\"{sentence}\""),
            Rule::Title => {
                let mut title = topic.to_owned();
                title[..1].make_ascii_uppercase();
                format!("<<{title}>> {sentence}")
            }
            Rule::EndWith(w) => format!("{} {}", sentence.trim_end_matches('.'), END_WORDS[w]),
            Rule::Keyword(w) => format!("{sentence} It is {}.", KEYWORDS[w]),
        }
    }

    /// The sentence, with the instruction ignored.
    fn novice(&self) -> String {
        TOPICS[self.topic].1.to_owned()
    }
}
