//! The [`Shop`] environment itself.

use super::{Catalog, Goal, ShopConfig};
use crate::EnvError;
use crate::action::extract_action;
use crate::prompt::TurnPrompt;
use crate::rng::Rng;
use crate::wrappers::{EnvExt, Episodic};
use roll_core::{Env, Observation, StepResult};
use std::sync::Arc;

const INSTRUCTIONS: &str = "You are shopping in a web store. Find and buy the product that \
matches the instruction: its type, attributes, options and price limit.\n\
Actions: search[your query] on the search page; click[button, product id or option] to press \
what the page offers (back to search, next >, < prev, a product id, an option value, buy now).";
const ANSWER_FORMAT: &str = "Answer with one action as <answer>click[buy now]</answer>.";

/// The page the agent is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Page {
    Search,
    Results { page: usize },
    Item { product: usize },
}

/// A parsed shop action.
enum Command {
    Search(String),
    Click(String),
}

/// The Shop environment (registered as `shop`): the store's rules in [`Episodic`] wrappers for
/// `max_steps` and `format_penalty`.
#[derive(Debug, Clone)]
pub struct Shop {
    env: Episodic<Store>,
}

/// The rules of the store, without the episode rules the wrappers add.
#[derive(Debug, Clone)]
struct Store {
    config: ShopConfig,
    catalog: Option<Arc<Catalog>>,
    goal: Option<Goal>,
    page: Page,
    query: String,
    hits: Vec<usize>,
    chosen: Vec<(&'static str, &'static str)>,
    /// Steps since the reset, for the prompt's turn index and actions left.
    steps: u32,
}

impl Shop {
    /// An environment with these options; call [`Env::reset`] before stepping.
    ///
    /// # Errors
    /// [`EnvError::InvalidOption`] if an option is out of range.
    pub fn new(config: ShopConfig) -> Result<Self, EnvError> {
        config.validate()?;
        let (max_steps, penalty) = (config.max_steps, config.format_penalty);
        let store = Store {
            config,
            catalog: None,
            goal: None,
            page: Page::Search,
            query: String::new(),
            hits: Vec::new(),
            chosen: Vec::new(),
            steps: 0,
        };
        Ok(Self {
            env: store.episodic("shop", max_steps, penalty)?,
        })
    }

    /// The catalogue of the current episode.
    pub fn catalog(&self) -> Option<&Catalog> {
        self.env.base().catalog.as_deref()
    }

    /// The goal of the current episode.
    pub fn goal(&self) -> Option<&Goal> {
        self.env.base().goal.as_ref()
    }

    /// An expert's actions from the search page: search for the goal, page to its product, pick
    /// the wanted options and buy — full reward when played from a fresh reset.
    pub fn expert_actions(&self) -> Vec<String> {
        self.env.base().expert_actions()
    }
}

impl Env for Shop {
    fn reset(&mut self, seed: u64) -> roll_core::Result<Observation> {
        self.env.reset(seed)
    }

    fn step(&mut self, action: &str) -> roll_core::Result<StepResult> {
        self.env.step(action)
    }
}

impl Store {
    fn expert_actions(&self) -> Vec<String> {
        let (Some(catalog), Some(goal)) = (self.catalog.as_deref(), self.goal.as_ref()) else {
            return Vec::new();
        };
        let query = format!("{} {}", goal.attributes.join(" "), goal.kind);
        let mut actions = vec![format!("search[{query}]")];
        let rank = catalog
            .search(&query)
            .iter()
            .position(|&i| i == goal.target);
        let Some(rank) = rank else {
            return actions;
        };
        actions.extend((0..rank / self.config.results_per_page).map(|_| "click[next >]".into()));
        actions.push(format!("click[{}]", catalog.products()[goal.target].id));
        actions.extend(goal.options.iter().map(|(_, v)| format!("click[{v}]")));
        actions.push("click[buy now]".into());
        actions
    }

    /// What can be clicked on the current page.
    fn clickables(&self, catalog: &Catalog) -> Vec<String> {
        let per_page = self.config.results_per_page;
        match self.page {
            Page::Search => Vec::new(),
            Page::Results { page } => {
                let mut c = vec!["back to search".to_string()];
                if page > 0 {
                    c.push("< prev".into());
                }
                if (page + 1) * per_page < self.hits.len() {
                    c.push("next >".into());
                }
                c.extend(self.shown(page).map(|i| catalog.products()[i].id.clone()));
                c
            }
            Page::Item { product } => {
                let mut c = vec!["back to search".to_string(), "< prev".into()];
                let p = &catalog.products()[product];
                c.extend(
                    p.options
                        .iter()
                        .flat_map(|(_, v)| v.iter().map(|s| s.to_string())),
                );
                c.push("buy now".into());
                c
            }
        }
    }

    fn shown(&self, page: usize) -> impl Iterator<Item = usize> + '_ {
        let per_page = self.config.results_per_page;
        self.hits
            .iter()
            .copied()
            .skip(page * per_page)
            .take(per_page)
    }

    fn render(&self, catalog: &Catalog, goal: &Goal) -> String {
        let mut s = format!("Instruction: {}\n", goal.instruction());
        match self.page {
            Page::Search => s.push_str("[Search]\n"),
            Page::Results { page } => {
                let pages = self
                    .hits
                    .len()
                    .div_ceil(self.config.results_per_page)
                    .max(1);
                s.push_str(&format!(
                    "Results for \"{}\" (page {} of {pages}, {} items):\n",
                    self.query,
                    page + 1,
                    self.hits.len()
                ));
                for i in self.shown(page) {
                    let p = &catalog.products()[i];
                    s.push_str(&format!("[{}] {} | {}\n", p.id, p.title, p.price()));
                }
            }
            Page::Item { product } => {
                let p = &catalog.products()[product];
                s.push_str(&format!("[{}] {}\nPrice: {}\n", p.id, p.title, p.price()));
                s.push_str(&format!("Features: {}\n", p.attributes.join(", ")));
                for (name, values) in &p.options {
                    let picked = self.chosen.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
                    let shown: Vec<String> = values
                        .iter()
                        .map(|v| {
                            if Some(*v) == picked {
                                format!("[{v}]*")
                            } else {
                                format!("[{v}]")
                            }
                        })
                        .collect();
                    s.push_str(&format!("{name}: {}\n", shown.join(" ")));
                }
            }
        }
        let actions = match self.page {
            Page::Search => "search[<your query>]".to_string(),
            _ => self
                .clickables(catalog)
                .iter()
                .map(|c| format!("click[{c}]"))
                .collect::<Vec<_>>()
                .join(", "),
        };
        s.push_str(&format!("Available actions: {actions}"));
        s
    }

    fn prompt(
        &self,
        catalog: &Catalog,
        goal: &Goal,
        first: bool,
        feedback: Option<&str>,
    ) -> String {
        TurnPrompt {
            instructions: first.then_some(INSTRUCTIONS),
            turn: self.steps + 1,
            feedback,
            observation: &self.render(catalog, goal),
            actions_left: self.config.max_steps.saturating_sub(self.steps),
            answer_format: ANSWER_FORMAT,
        }
        .render()
    }

    /// Applies a command; `Ok(Some(reward))` when it bought something, `Err(())` if it is not
    /// available on this page.
    fn apply(
        &mut self,
        catalog: &Catalog,
        goal: &Goal,
        command: Command,
    ) -> Result<Option<f32>, ()> {
        match (command, self.page) {
            (Command::Search(query), Page::Search) if !query.is_empty() => {
                self.hits = catalog.search(&query);
                self.query = query;
                self.page = Page::Results { page: 0 };
                Ok(None)
            }
            (Command::Search(_), _) => Err(()),
            (Command::Click(target), page) => {
                let wanted = normalise(&target);
                let hit = self
                    .clickables(catalog)
                    .into_iter()
                    .find(|c| normalise(c) == wanted)
                    .ok_or(())?;
                match (hit.as_str(), page) {
                    ("back to search", _) => {
                        self.page = Page::Search;
                        self.chosen.clear();
                    }
                    ("< prev", Page::Results { page }) => {
                        self.page = Page::Results { page: page - 1 }
                    }
                    ("next >", Page::Results { page }) => {
                        self.page = Page::Results { page: page + 1 }
                    }
                    ("< prev", Page::Item { .. }) => {
                        self.chosen.clear();
                        let page = self
                            .hits
                            .iter()
                            .position(|&i| Some(i) == self.current_product())
                            .map_or(0, |r| r / self.config.results_per_page);
                        self.page = Page::Results { page };
                    }
                    ("buy now", Page::Item { product }) => {
                        return Ok(Some(
                            goal.reward(&catalog.products()[product], &self.chosen),
                        ));
                    }
                    (_, Page::Results { .. }) => {
                        let product = catalog.find(&hit).ok_or(())?;
                        self.page = Page::Item { product };
                        self.chosen.clear();
                    }
                    (_, Page::Item { product }) => {
                        let p = &catalog.products()[product];
                        let (name, value) = p
                            .options
                            .iter()
                            .find_map(|(n, vs)| vs.iter().find(|v| **v == hit).map(|v| (*n, *v)))
                            .ok_or(())?;
                        self.chosen.retain(|(n, _)| *n != name);
                        self.chosen.push((name, value));
                    }
                    _ => return Err(()),
                }
                Ok(None)
            }
        }
    }

    fn current_product(&self) -> Option<usize> {
        match self.page {
            Page::Item { product } => Some(product),
            _ => None,
        }
    }
}

/// Parses `search[...]`, `click[...]` and the bare shortcuts `buy`, `next`, `prev`, `back`.
fn parse(action: &str) -> Option<Command> {
    let content = extract_action(action);
    let lower = content.to_ascii_lowercase();
    let inner = |prefix: &str| {
        lower
            .strip_prefix(prefix)
            .and_then(|rest| rest.trim_start().strip_prefix('['))
            .and_then(|rest| rest.strip_suffix(']'))
            .map(|s| s.trim().to_string())
    };
    if let Some(q) = inner("search") {
        return Some(Command::Search(q));
    }
    if let Some(t) = inner("click") {
        return Some(Command::Click(t));
    }
    let shortcut = match lower.as_str() {
        "buy" | "buy now" => "buy now",
        "next" | "next page" => "next >",
        "prev" | "previous" | "back" => "< prev",
        "back to search" => "back to search",
        _ => return None,
    };
    Some(Command::Click(shortcut.into()))
}

/// Case-insensitive, ignoring the arrows of `< prev` and `next >`.
fn normalise(s: &str) -> String {
    s.to_lowercase().replace(['<', '>'], "").trim().to_string()
}

impl Env for Store {
    fn reset(&mut self, seed: u64) -> roll_core::Result<Observation> {
        let catalog = match (self.config.catalog_seed, &self.catalog) {
            (Some(_), Some(c)) => c.clone(),
            (Some(cs), None) => Arc::new(Catalog::generate(
                self.config.num_products,
                &mut Rng::new(cs, 0x5409),
            )),
            (None, _) => Arc::new(Catalog::generate(
                self.config.num_products,
                &mut Rng::new(seed, 0x5409),
            )),
        };
        let goal = Goal::draw(&catalog, &mut Rng::new(seed, 0x60A1));
        self.page = Page::Search;
        self.query.clear();
        self.hits.clear();
        self.chosen.clear();
        self.steps = 0;
        let mut obs = Observation::new(self.prompt(&catalog, &goal, true, None));
        obs.info
            .insert("env_instruction".into(), INSTRUCTIONS.into());
        obs.info.insert("goal".into(), goal.instruction().into());
        self.catalog = Some(catalog);
        self.goal = Some(goal);
        Ok(obs)
    }

    /// An unparseable action, or one the page does not offer, is a no-op with reward 0, marked
    /// invalid.
    fn step(&mut self, action: &str) -> roll_core::Result<StepResult> {
        let (Some(catalog), Some(goal)) = (self.catalog.clone(), self.goal.clone()) else {
            // Only reachable before the first reset if used unguarded.
            return Err(EnvError::NotReset { env: "shop".into() }.into());
        };
        self.steps += 1;
        let outcome = parse(action)
            .ok_or(())
            .and_then(|c| self.apply(&catalog, &goal, c));
        let step = match outcome {
            Err(()) => {
                let feedback = format!(
                    "At turn {}, your action was not valid on this page.",
                    self.steps
                );
                StepResult::running(self.prompt(&catalog, &goal, false, Some(&feedback)), 0.0)
                    .with_action_valid(false)
                    .with_info("success", false)
            }
            Ok(Some(reward)) => {
                let feedback = format!("You bought it. Reward: {reward:.2}.");
                StepResult::terminated(self.prompt(&catalog, &goal, false, Some(&feedback)), reward)
                    .with_action_valid(true)
                    .with_info("success", reward >= 0.999)
            }
            Ok(None) => {
                let feedback = format!("At turn {}, done.", self.steps);
                StepResult::running(self.prompt(&catalog, &goal, false, Some(&feedback)), 0.0)
                    .with_action_valid(true)
                    .with_info("success", false)
            }
        };
        Ok(step.with_info("action", extract_action(action)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roll_core::EnvStatus;

    #[test]
    fn the_expert_buys_the_right_thing_and_navigation_works() {
        let mut env = Shop::new(ShopConfig::default()).unwrap();
        for seed in 0..30 {
            let obs = env.reset(seed).unwrap();
            assert!(obs.text.contains("Instruction: i need") && obs.text.contains("[Search]"));
            let actions = env.expert_actions();
            let mut last = None;
            for a in &actions {
                last = Some(env.step(&format!("<answer>{a}</answer>")).unwrap());
            }
            let last = last.unwrap();
            assert_eq!(
                last.status,
                EnvStatus::Terminated,
                "seed {seed}: {actions:?}"
            );
            assert!((last.reward - 1.0).abs() < 1e-6, "seed {seed}");
        }
    }

    #[test]
    fn unavailable_actions_are_penalised_no_ops() {
        let mut env = Shop::new(ShopConfig {
            format_penalty: -0.05,
            max_steps: 4,
            ..Default::default()
        })
        .unwrap();
        env.reset(1).unwrap();
        for bad in ["click[buy now]", "hello", "search[]"] {
            let r = env.step(bad).unwrap();
            assert_eq!(
                (r.reward, r.info["action_is_valid"].clone()),
                (-0.05, false.into()),
                "{bad}"
            );
            assert!(r.observation.contains("[Search]"));
        }
        let r = env.step("Action: search[shoes]").unwrap();
        assert_eq!(r.status, EnvStatus::Truncated);
        assert!(r.observation.contains("Results for \"shoes\""));
    }

    #[test]
    fn shortcuts_and_back_navigation() {
        let mut env = Shop::new(ShopConfig::default()).unwrap();
        env.reset(2).unwrap();
        env.step("search[shoes]").unwrap();
        let r = env.step("next").unwrap();
        assert!(r.observation.contains("page 2 of"), "{}", r.observation);
        let r = env.step("click[< Prev]").unwrap();
        assert!(r.observation.contains("page 1 of"));
        let r = env.step("back").unwrap();
        assert_eq!(r.info["action_is_valid"], false);
        let r = env.step("click[Back to Search]").unwrap();
        assert!(r.observation.contains("[Search]"));
    }
}
