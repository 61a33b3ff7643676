//! `[domains.<name>]`: the task domains of an RLVR run, how often each is sampled, which reward
//! worker scores it and which dataset tags belong to it ([`DomainMap`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::check::Checker;
use super::component::ComponentSpec;
use crate::{Error, Prompt, Result};

/// `[domains.<name>]`: one task domain (math, code, ...). ROLL: `rewards.<domain>` plus the
/// domain's entry in `domain_interleave_probs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainConfig {
    /// Relative sampling weight (>= 0): each step takes `ratio / sum(ratios)` of
    /// `rollout.prompts_per_step` prompts from this domain. Default `1.0`.
    /// ROLL: `domain_interleave_probs.<domain>`.
    #[serde(default = "default_ratio")]
    pub ratio: f64,
    /// Dataset tags whose prompts belong to this domain; each tag may name one domain only.
    /// Default none. ROLL: `rewards.<domain>.tag_included`.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The reward worker that scores this domain's samples. Required.
    /// ROLL: `rewards.<domain>.worker_cls`.
    pub reward: ComponentSpec,
}

fn default_ratio() -> f64 {
    1.0
}

impl DomainConfig {
    /// A domain scored by `reward`, with ratio 1 and no tags.
    pub fn new(reward: ComponentSpec) -> Self {
        Self {
            ratio: default_ratio(),
            tags: Vec::new(),
            reward,
        }
    }
}

/// Which domain a prompt belongs to: the one resolver from dataset tags to the domains of a run's
/// `[domains]` config (ROLL: `tag_included` → `tag_2_domain`).
///
/// A tag resolves to the domain whose `tags` list it, and a domain's own name resolves to itself
/// (so data tagged `math` needs no `tags` entry in `[domains.math]`). Anything else is an error
/// naming the tag and listing the known domains and tags: ROLL sends an unknown tag to
/// `math_rule` silently, which scores a whole mis-tagged dataset with the wrong verifier.
///
/// The map is applied once per prompt, when the prompt enters the RLVR pipeline
/// ([`resolve_prompt`](Self::resolve_prompt) sets [`Prompt::domain`]); the reward router, the
/// reward cache and the batch builder then read `prompt.domain` and never see a tag. That is
/// what makes two datasets of one domain one domain everywhere: scored by the same worker,
/// normalised in the same bucket, sampled under the same ratio.
///
/// ```
/// use roll_core::config::DomainMap;
/// use roll_core::{Prompt, PromptId};
///
/// let map = DomainMap::new([("math", vec!["gsm8k", "math500"]), ("code", vec![])])?;
/// assert_eq!(map.resolve("gsm8k")?, "math");
/// assert_eq!(map.resolve("code")?, "code");
///
/// let mut prompt = Prompt::new(PromptId(0), "2+2?", "math500");
/// map.resolve_prompt(&mut prompt)?;
/// assert_eq!((prompt.tag.as_str(), prompt.domain.as_str()), ("math500", "math"));
///
/// let err = map.resolve("chem").unwrap_err().to_string();
/// assert!(err.contains("`chem`") && err.contains("`code`, `math`"), "{err}");
/// # Ok::<(), roll_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainMap {
    /// Every tag and every domain name, to its domain.
    to_domain: BTreeMap<String, String>,
    /// The domains, sorted.
    domains: Vec<String>,
}

impl DomainMap {
    /// The map of `domains`, each given with its tags.
    ///
    /// # Errors
    /// [`Error::InvalidValue`] naming the key (`domains.<name>.tags.<i>`) of a tag listed by two
    /// domains or equal to the name of another domain, and of a domain given twice.
    pub fn new<I, D, T, S>(domains: I) -> Result<Self>
    where
        I: IntoIterator<Item = (D, T)>,
        D: Into<String>,
        T: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let entries: Vec<(String, Vec<String>)> = domains
            .into_iter()
            .map(|(d, tags)| (d.into(), tags.into_iter().map(Into::into).collect()))
            .collect();
        let mut to_domain = BTreeMap::new();
        for (name, _) in &entries {
            if to_domain.insert(name.clone(), name.clone()).is_some() {
                return Err(Checker::new("domains").invalid(
                    name,
                    format!("{name:?}"),
                    "a domain given once",
                ));
            }
        }
        let mut tag_owner: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, tags) in &entries {
            let c = Checker::new(format!("domains.{name}"));
            for (i, tag) in tags.iter().enumerate() {
                let field = format!("tags.{i}");
                if tag != name && to_domain.get(tag) == Some(tag) {
                    return Err(c.invalid(
                        &field,
                        format!("{tag:?}"),
                        &format!("a tag that is not the name of another domain (`domains.{tag}`)"),
                    ));
                }
                if let Some(other) = tag_owner.insert(tag, name)
                    && other != name
                {
                    return Err(c.invalid(
                        &field,
                        format!("{tag:?}"),
                        &format!("a tag not already routed to another domain (`domains.{other}`)"),
                    ));
                }
            }
        }
        for (tag, name) in tag_owner {
            to_domain.insert(tag.to_owned(), name.to_owned());
        }
        let mut names: Vec<String> = entries.into_iter().map(|(name, _)| name).collect();
        names.sort();
        Ok(Self {
            to_domain,
            domains: names,
        })
    }

    /// The map of a run's `[domains]` config.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn from_config(domains: &BTreeMap<String, DomainConfig>) -> Result<Self> {
        Self::new(domains.iter().map(|(name, d)| (name, &d.tags)))
    }

    /// The domains, sorted.
    pub fn domains(&self) -> &[String] {
        &self.domains
    }

    /// Whether `name` is one of the domains.
    pub fn contains_domain(&self, name: &str) -> bool {
        self.domains
            .binary_search_by(|d| d.as_str().cmp(name))
            .is_ok()
    }

    /// The domain of `tag` (a tag listed by a domain, or a domain's own name).
    ///
    /// # Errors
    /// [`Error::InvalidData`] naming the tag and listing the known domains and tags.
    pub fn resolve(&self, tag: &str) -> Result<&str> {
        self.to_domain.get(tag).map(String::as_str).ok_or_else(|| {
            Error::invalid_data(
                "prompt tag",
                format!("`{tag}`, {}", self.unknown_tag_reason()),
            )
        })
    }

    /// Sets `prompt.domain` from `prompt.tag`. A domain set explicitly (one that differs from the
    /// tag, by [`Prompt::with_domain`] or an earlier resolution) is kept, as ROLL keeps a row's
    /// own `domain`; it must be one of the domains. Resolving a prompt twice changes nothing.
    ///
    /// # Errors
    /// [`Error::InvalidData`] naming the prompt and its unknown tag (or explicit domain) and
    /// listing the known domains and tags.
    pub fn resolve_prompt(&self, prompt: &mut Prompt) -> Result<()> {
        if prompt.domain != prompt.tag {
            if self.contains_domain(&prompt.domain) {
                return Ok(());
            }
            return Err(Error::invalid_data(
                "prompt",
                format!(
                    "{} (tag `{}`) has domain `{}`, which is not a configured domain; known domains: {}",
                    prompt.id,
                    prompt.tag,
                    prompt.domain,
                    list(self.domains.iter())
                ),
            ));
        }
        let domain = self.to_domain.get(&prompt.tag).ok_or_else(|| {
            Error::invalid_data(
                "prompt",
                format!(
                    "{} has tag `{}`, {}",
                    prompt.id,
                    prompt.tag,
                    self.unknown_tag_reason()
                ),
            )
        })?;
        prompt.domain.clone_from(domain);
        Ok(())
    }

    /// Resolves every prompt of a dataset ([`resolve_prompt`](Self::resolve_prompt)) and groups
    /// them by domain, each in the order read. Domains without prompts are absent.
    ///
    /// # Errors
    /// [`Error::InvalidData`] if any prompt resolves to no domain, listing every unknown tag
    /// (and unknown explicit domain) with its number of prompts and the first of them, and the
    /// known domains and tags — the whole dataset is checked, so one run of the fix is enough.
    pub fn split(
        &self,
        prompts: impl IntoIterator<Item = Prompt>,
    ) -> Result<BTreeMap<String, Vec<Prompt>>> {
        let mut by_domain: BTreeMap<String, Vec<Prompt>> = BTreeMap::new();
        // What failed to resolve ("tag `x`" or "domain `x`") → (prompts, first prompt).
        let mut unknown: BTreeMap<String, (usize, String)> = BTreeMap::new();
        for mut prompt in prompts {
            if self.resolve_prompt(&mut prompt).is_err() {
                let what = if prompt.domain == prompt.tag {
                    format!("tag `{}`", prompt.tag)
                } else {
                    format!("domain `{}`", prompt.domain)
                };
                unknown.entry(what).or_insert((0, prompt.id.to_string())).0 += 1;
                continue;
            }
            by_domain
                .entry(prompt.domain.clone())
                .or_default()
                .push(prompt);
        }
        if unknown.is_empty() {
            return Ok(by_domain);
        }
        let total: usize = unknown.values().map(|(n, _)| n).sum();
        let each: Vec<String> = unknown
            .iter()
            .map(|(what, (n, first))| format!("{what} ({n}, first {first})"))
            .collect();
        Err(Error::invalid_data(
            "prompts",
            format!(
                "{total} resolve to no domain: {}; a tag must be a domain or be listed in \
                 `domains.<name>.tags`; known domains: {}; known tags: {}",
                each.join(", "),
                list(self.domains.iter()),
                list(self.tags())
            ),
        ))
    }

    /// The tags listed by the domains (not the domain names), sorted.
    fn tags(&self) -> impl Iterator<Item = &String> {
        self.to_domain
            .iter()
            .filter(|(tag, domain)| tag != domain)
            .map(|(tag, _)| tag)
    }

    fn unknown_tag_reason(&self) -> String {
        format!(
            "which is neither a domain nor listed in any `domains.<name>.tags`; known domains: {}; known tags: {}",
            list(self.domains.iter()),
            list(self.tags())
        )
    }
}

fn list<'a>(items: impl Iterator<Item = &'a String>) -> String {
    let items: Vec<String> = items.map(|s| format!("`{s}`")).collect();
    if items.is_empty() {
        "(none)".to_owned()
    } else {
        items.join(", ")
    }
}

/// Checks every domain and the set as a whole: ratios finite and >= 0 with a positive sum, names
/// usable as keys, and tags that resolve unambiguously (the checks of [`DomainMap::new`]).
pub(crate) fn validate_domains(domains: &BTreeMap<String, DomainConfig>) -> Result<()> {
    for (name, domain) in domains {
        let c = Checker::new(format!("domains.{name}"));
        Checker::new("domains").require(
            !name.is_empty()
                && name
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-'),
            name,
            format!("{name:?}"),
            "a domain name of letters, digits, `_` and `-`",
        )?;
        c.non_negative("ratio", domain.ratio)?;
        domain.reward.validate(&c.key("reward"))?;
    }
    DomainMap::from_config(domains)?;
    let total: f64 = domains.values().map(|d| d.ratio).sum();
    Checker::new("").require(
        domains.is_empty() || total > 0.0,
        "domains",
        format!("ratios summing to {total}"),
        "ratios with a sum > 0",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PromptId;

    fn domains(entries: &[(&str, f64, &[&str])]) -> BTreeMap<String, DomainConfig> {
        entries
            .iter()
            .map(|(name, ratio, tags)| {
                let mut d = DomainConfig::new(ComponentSpec::new("math_rule"));
                d.ratio = *ratio;
                d.tags = tags.iter().map(|t| t.to_string()).collect();
                (name.to_string(), d)
            })
            .collect()
    }

    #[test]
    fn valid_domains_pass() {
        let d = domains(&[("math", 0.7, &["gsm8k"]), ("code", 0.3, &["mbpp"])]);
        assert!(validate_domains(&d).is_ok());
        assert!(validate_domains(&BTreeMap::new()).is_ok());
    }

    #[test]
    fn zero_sum_and_negative_ratios_fail() {
        let err = validate_domains(&domains(&[("math", 0.0, &[])])).expect_err("sum");
        assert!(err.to_string().contains("`domains`"), "{err}");
        let err = validate_domains(&domains(&[("math", -1.0, &[])])).expect_err("neg");
        assert!(err.to_string().contains("domains.math.ratio"), "{err}");
    }

    #[test]
    fn a_tag_routes_to_one_domain() {
        let d = domains(&[("a", 1.0, &["t"]), ("b", 1.0, &["u", "t"])]);
        let err = validate_domains(&d).expect_err("dup tag").to_string();
        assert!(
            err.contains("domains.b.tags.1") && err.contains("domains.a"),
            "{err}"
        );
    }

    #[test]
    fn a_tag_may_not_be_another_domains_name() {
        let d = domains(&[("code", 1.0, &[]), ("math", 1.0, &["gsm8k", "code"])]);
        let err = validate_domains(&d).expect_err("shadowing tag").to_string();
        assert!(
            err.contains("domains.math.tags.1") && err.contains("`domains.code`"),
            "{err}"
        );
        // Naming the own domain is redundant, not ambiguous.
        let d = domains(&[("math", 1.0, &["math", "gsm8k"])]);
        assert_eq!(
            DomainMap::from_config(&d).unwrap().resolve("math").unwrap(),
            "math"
        );
        let err = DomainMap::new([("a", vec!["t"]), ("a", vec![])]).expect_err("dup domain");
        assert!(err.to_string().contains("domains.a"), "{err}");
    }

    #[test]
    fn tags_and_domain_names_resolve_to_their_domain() {
        let map = DomainMap::from_config(&domains(&[
            ("math", 1.0, &["gsm8k", "math500"]),
            ("code", 1.0, &["mbpp"]),
        ]))
        .unwrap();
        assert_eq!(map.domains(), ["code", "math"]);
        for (tag, domain) in [
            ("gsm8k", "math"),
            ("math500", "math"),
            ("math", "math"),
            ("mbpp", "code"),
            ("code", "code"),
        ] {
            assert_eq!(map.resolve(tag).unwrap(), domain, "{tag}");
        }
        let err = map.resolve("chem").unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid prompt tag: `chem`, which is neither a domain nor listed in any \
             `domains.<name>.tags`; known domains: `code`, `math`; known tags: `gsm8k`, \
             `math500`, `mbpp`"
        );
    }

    #[test]
    fn resolving_a_prompt_sets_its_domain_once() {
        let map = DomainMap::new([("math", ["gsm8k"])]).unwrap();
        let mut p = Prompt::new(PromptId(4), "q", "gsm8k");
        map.resolve_prompt(&mut p).unwrap();
        assert_eq!((p.tag.as_str(), p.domain.as_str()), ("gsm8k", "math"));
        let again = p.clone();
        map.resolve_prompt(&mut p).unwrap();
        assert_eq!(p, again);

        let mut unknown = Prompt::new(PromptId(5), "q", "chem");
        let err = map.resolve_prompt(&mut unknown).unwrap_err().to_string();
        assert!(
            err.contains("prompt#5 has tag `chem`") && err.contains("`math`"),
            "{err}"
        );
        assert_eq!(
            unknown.domain, "chem",
            "a failed resolution changes nothing"
        );

        // An explicit domain wins over the tag, but must exist.
        let mut explicit = Prompt::new(PromptId(6), "q", "chem").with_domain("math");
        map.resolve_prompt(&mut explicit).unwrap();
        assert_eq!(explicit.domain, "math");
        let mut bad = Prompt::new(PromptId(7), "q", "gsm8k").with_domain("physics");
        let err = map.resolve_prompt(&mut bad).unwrap_err().to_string();
        assert!(
            err.contains("prompt#7 (tag `gsm8k`) has domain `physics`") && err.contains("`math`"),
            "{err}"
        );
    }

    #[test]
    fn a_dataset_is_split_by_domain_or_rejected_with_every_unknown_tag() {
        let map = DomainMap::new([("math", vec!["gsm8k", "math500"]), ("code", vec![])]).unwrap();
        let tagged = |id: u64, tag: &str| Prompt::new(PromptId(id), "q", tag);
        let split = map
            .split([tagged(0, "gsm8k"), tagged(1, "code"), tagged(2, "math500")])
            .unwrap();
        let ids = |d: &str| -> Vec<u64> { split[d].iter().map(|p| p.id.0).collect() };
        assert_eq!((ids("math"), ids("code")), (vec![0, 2], vec![1]));
        assert!(split["math"].iter().all(|p| p.domain == "math"));

        let err = map
            .split([
                tagged(0, "gsm8k"),
                tagged(1, "chem"),
                tagged(2, "chem"),
                tagged(3, "gsm8k").with_domain("physics"),
                tagged(4, "bio"),
            ])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "invalid prompts: 4 resolve to no domain: domain `physics` (1, first prompt#3), tag `bio` \
             (1, first prompt#4), tag `chem` (2, first prompt#1); a tag must be a domain or be listed in \
             `domains.<name>.tags`; known domains: `code`, `math`; known tags: `gsm8k`, `math500`"
        );
    }

    #[test]
    fn an_unnamed_reward_fails() {
        let mut d = domains(&[("math", 1.0, &[])]);
        if let Some(math) = d.get_mut("math") {
            math.reward.kind.clear();
        }
        let err = validate_domains(&d).expect_err("kind").to_string();
        assert!(err.contains("domains.math.reward.kind"), "{err}");
    }
}
