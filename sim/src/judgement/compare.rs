//! Comparing configurations: the same seeds through two or more scenarios,
//! side by side, and which differences hold across seeds.
//!
//! `redstring-sim compare a.toml b.toml --seeds 1..20` runs every scenario
//! over the same seeds; `--set key=v1,v2,…` makes the variants from one file
//! by changing one field ([`set_field`]). Several `--set` make a full
//! factorial design ([`design`]): one variant per combination of one value
//! of each key, in nested-loop order with the first `--set` varying slowest,
//! named by its `key=value` pairs joined by a space ([`setting_name`]), at
//! most [`MAX_VARIANTS`] of them; they are compared in one table like any
//! other variants, the first (every key at its first value) the baseline.
//! A failing seed of any variant is replayed by the command [`replay`]
//! gives.
//! Each variant's figures are
//! summarised as a sweep's ([`SweepSummary`]); each later variant is then
//! compared with the first, figure by figure, with a **paired sign test**
//! over the seeds both measured ([`SignTest`]): seed by seed, is the figure
//! higher or lower than the first variant's? Ties are dropped. Each fault
//! episode's figures are compared the same way, between the episodes of
//! the same name. The difference
//! *holds across seeds* when the two-sided exact binomial p-value of the
//! split is below [`SIGNIFICANCE`]. Paired, because one seed gives both
//! variants the same arrivals and draws, so seed-to-seed noise cancels; a
//! sign test, because it assumes nothing about the figures' distributions
//! (latencies and recovery times are skewed and bounded).

use std::fmt::Write as _;

use serde::Serialize;

use crate::judgement::shard::Shard;
use crate::judgement::sweep::{
    CLASS_FIGURE_NAMES, Distribution, EPISODE_FIGURE_NAMES, FIGURE_NAMES, SERVER_FIGURE_NAMES, SeedRecord, SweepSummary,
};

/// The whole-run figure that counts the calls the limiter held back.
const DEFERRED: &str = "calls_deferred";

/// The p-value below which a difference is said to hold across seeds.
pub const SIGNIFICANCE: f64 = 0.05;

/// Why `--set` could not be applied.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SetError {
    /// The argument is not `key=v1,v2,…`.
    #[error("--set {0:?}: expected key=value[,value…], e.g. hardening.failure_threshold=1,3,5")]
    Syntax(String),
    /// The scenario text is not TOML.
    #[error("--set {key}: the scenario is not valid TOML: {message}")]
    Toml {
        /// The dotted key.
        key: String,
        /// The parser's message.
        message: String,
    },
    /// The dotted key has more steps than any scenario field.
    #[error("--set {key}…: {depth} dotted steps, more than any scenario field has (at most {MAX_KEY_DEPTH})")]
    TooDeep {
        /// The key's start.
        key: String,
        /// Its steps.
        depth: usize,
    },
    /// A step of the dotted key leads into something that is not a table
    /// (or, for a number, an array long enough).
    #[error("--set {key}: {at:?} is not a table or an array index in the scenario")]
    Path {
        /// The dotted key.
        key: String,
        /// The step that failed.
        at: String,
    },
    /// Two `--set` name the same key.
    #[error(
        "--set {0} is given twice: each --set is one axis of the design; give all of a key's values in one --set {0}=v1,v2,…"
    )]
    Duplicate(String),
    /// The `--set` make more variants than [`MAX_VARIANTS`].
    #[error(
        "--set: {} values make {} variants, more than the {MAX_VARIANTS} one compare runs; give fewer values, or split the design over several compares",
        counts.iter().map(usize::to_string).collect::<Vec<_>>().join(" × "),
        product.map_or_else(|| "too many to count".to_owned(), |n| n.to_string())
    )]
    TooManyVariants {
        /// Each `--set`'s number of values, in the order given.
        counts: Vec<usize>,
        /// Their product, when it fits a `usize`.
        product: Option<usize>,
    },
}

/// Most dotted steps a `--set` or `--vary` key may have: the deepest
/// scenario field (`workers.0.tenants.0.replay.speedup`) has six.
pub const MAX_KEY_DEPTH: usize = 8;

/// `key=v1,v2,…` split into the key and its values.
pub fn parse_set(arg: &str) -> Result<(String, Vec<String>), SetError> {
    let (key, values) = arg.split_once('=').ok_or_else(|| SetError::Syntax(arg.to_owned()))?;
    let key = key.trim();
    let values: Vec<String> = values.split(',').map(|v| v.trim().to_owned()).collect();
    if key.is_empty() || values.iter().any(String::is_empty) || key.split('.').any(str::is_empty) {
        return Err(SetError::Syntax(arg.to_owned()));
    }
    Ok((key.to_owned(), values))
}

/// Most variants the `--set` of one `compare` may make together: a
/// factorial design grows as the product of its axes (four axes of five
/// values are 625 variants, hours of runs and a table no one reads), so a
/// larger one is refused before anything is run. Split a larger design over
/// several compares, each fixing one axis in its scenario file. One `--set`
/// alone is not bounded: its values are each written out.
pub const MAX_VARIANTS: usize = 64;

/// One variant of a `--set` design: each `--set`'s key with the one value
/// it takes in this variant, in the order the `--set` were given.
pub type Setting = Vec<(String, String)>;

/// The variants several `--set key=v1,v2,…` make together: every
/// combination of one value per key (a full factorial design), in the order
/// of nested loops with the first `--set` outermost — the first key varies
/// slowest, the last fastest, each key's values in the order given. With
/// `--set a=1,2 --set b=x,y`: `a=1 b=x`, `a=1 b=y`, `a=2 b=x`, `a=2 b=y`.
///
/// Refused: a `--set` that is not `key=v1,v2,…` ([`parse_set`]), a key
/// given twice, and, with more than one `--set`, a product of more than
/// [`MAX_VARIANTS`] (computed with checked arithmetic, before any variant
/// is made).
pub fn design<S: AsRef<str>>(sets: &[S]) -> Result<Vec<Setting>, SetError> {
    let mut axes: Vec<(String, Vec<String>)> = Vec::with_capacity(sets.len());
    for set in sets {
        let (key, values) = parse_set(set.as_ref())?;
        if axes.iter().any(|(k, _)| *k == key) {
            return Err(SetError::Duplicate(key));
        }
        axes.push((key, values));
    }
    let counts: Vec<usize> = axes.iter().map(|(_, v)| v.len()).collect();
    let product = counts.iter().try_fold(1usize, |n, &c| n.checked_mul(c));
    if axes.len() > 1 && product.is_none_or(|n| n > MAX_VARIANTS) {
        return Err(SetError::TooManyVariants { counts, product });
    }
    let total = if axes.is_empty() { 0 } else { product.unwrap_or(0) };
    Ok((0..total)
        .map(|i| {
            // `i` in mixed radix, the last axis the lowest digit.
            let mut rest = i;
            let mut setting: Setting = axes
                .iter()
                .rev()
                .map(|(key, values)| {
                    let value = values[rest % values.len()].clone();
                    rest /= values.len();
                    (key.clone(), value)
                })
                .collect();
            setting.reverse();
            setting
        })
        .collect())
}

/// The name a variant of a `--set` design is shown by: its `key=value`
/// pairs in `--set` order, separated by one space, each a shell word
/// ([`shell_word`](crate::judgement::shell_word): quoted only when it holds
/// a character a shell would read), so that the name pasted after
/// `--set` flags makes that variant again. A one-`--set` variant is named
/// `key=value` as it is.
pub fn setting_name(setting: &[(String, String)]) -> String {
    match setting {
        [(key, value)] => format!("{key}={value}"),
        _ => setting
            .iter()
            .map(|(key, value)| super::shell_word(&format!("{key}={value}")))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// The `--set` flags that make one variant: `--set key=value` per key, each
/// a shell word, for an error message or a command to paste.
pub fn setting_flags(setting: &[(String, String)]) -> String {
    setting
        .iter()
        .map(|(key, value)| format!("--set {}", super::shell_word(&format!("{key}={value}"))))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The command that replays `seed` of one variant, to paste: for a file
/// (an empty `setting`), `redstring-sim run FILE --seed S`; for a variant
/// of `--set`, which `run` does not take, the compare of that one variant
/// over that one seed, `redstring-sim compare FILE --set key=value … --seeds
/// S..=S`. Every word is quoted as the shell needs it.
pub fn replay(file: &str, setting: &[(String, String)], seed: u64) -> String {
    let file = super::shell_word(file);
    if setting.is_empty() {
        format!("redstring-sim run {file} --seed {seed}")
    } else {
        format!(
            "redstring-sim compare {file} {} --seeds {seed}..={seed}",
            setting_flags(setting)
        )
    }
}

/// `text` (a scenario file) with each key of `setting` set to its value by
/// [`set_field`], in order.
pub fn apply(text: &str, setting: &[(String, String)]) -> Result<String, SetError> {
    let mut text = text.to_owned();
    for (key, value) in setting {
        text = set_field(&text, key, value)?;
    }
    Ok(text)
}

/// A value as TOML reads it (`3`, `0.5`, `true`, `"x"`, `{ mode = "error" }`),
/// or, if it is not TOML, the text as a string.
fn value_of(text: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {text}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.to_owned()))
}

/// `text` (a scenario file) with the dotted `key` set to `value`, before the
/// scenario is validated: tables along the key are made if absent, a number
/// indexes an array (`servers.0.slots`). Validation then judges the value
/// and names the field as usual.
pub fn set_field(text: &str, key: &str, value: &str) -> Result<String, SetError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| SetError::Toml {
        key: key.to_owned(),
        message: e.to_string().trim_end().to_owned(),
    })?;
    let steps: Vec<&str> = key.split('.').collect();
    if steps.len() > MAX_KEY_DEPTH {
        return Err(SetError::TooDeep {
            key: key.chars().take(80).collect(),
            depth: steps.len(),
        });
    }
    let mut root = toml::Value::Table(table);
    set_at(&mut root, &steps, value_of(value)).map_err(|at| SetError::Path {
        key: key.to_owned(),
        at: at.to_owned(),
    })?;
    match root {
        toml::Value::Table(t) => toml::to_string(&t).map_err(|e| SetError::Toml {
            key: key.to_owned(),
            message: e.to_string(),
        }),
        _ => Err(SetError::Path {
            key: key.to_owned(),
            at: key.to_owned(),
        }),
    }
}

/// Sets `value` at `steps` under `here`; on failure, the step that failed.
fn set_at<'k>(here: &mut toml::Value, steps: &[&'k str], value: toml::Value) -> Result<(), &'k str> {
    let Some((step, rest)) = steps.split_first() else {
        *here = value;
        return Ok(());
    };
    let next = match here {
        toml::Value::Table(t) => t.entry(step.to_string()).or_insert_with(|| {
            if rest.is_empty() {
                toml::Value::Boolean(false)
            } else {
                toml::Value::Table(toml::Table::new())
            }
        }),
        toml::Value::Array(a) => step.parse::<usize>().ok().and_then(|i| a.get_mut(i)).ok_or(*step)?,
        _ => return Err(step),
    };
    set_at(next, rest, value)
}

/// A paired sign test of one figure of one variant against the first.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SignTest {
    /// The figure (named as in the sweep summary).
    pub figure: &'static str,
    /// The fault episode the figure is of (its name as the sweep summary
    /// gives it); absent for a whole-run figure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub episode: Option<String>,
    /// The model server the figure is of; absent for a figure of the run
    /// or of an episode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// The priority class the figure is of; absent but for a class's figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// The variant compared with the first.
    pub variant: String,
    /// Seeds where the figure was higher than the first variant's.
    pub higher: u64,
    /// Seeds where it was lower.
    pub lower: u64,
    /// Seeds where it was equal (left out of the test).
    pub ties: u64,
    /// The two-sided exact binomial p-value of `higher` against `lower`.
    pub p_value: f64,
    /// Whether the difference holds across seeds (`p_value < SIGNIFICANCE`).
    pub holds: bool,
}

impl SignTest {
    /// The sign test of `pairs` (the first variant's figure, the other's,
    /// per seed both measured); `None` when there is no pair.
    fn of(
        figure: &'static str,
        episode: Option<&str>,
        variant: &str,
        pairs: impl Iterator<Item = (f64, f64)>,
    ) -> Option<SignTest> {
        let (mut higher, mut lower, mut ties) = (0u64, 0u64, 0u64);
        for (a, b) in pairs {
            match b.total_cmp(&a) {
                std::cmp::Ordering::Greater => higher += 1,
                std::cmp::Ordering::Less => lower += 1,
                std::cmp::Ordering::Equal => ties += 1,
            }
        }
        if higher + lower + ties == 0 {
            return None;
        }
        let p_value = sign_test_p(higher, lower);
        Some(SignTest {
            figure,
            episode: episode.map(str::to_owned),
            server: None,
            class: None,
            variant: variant.to_owned(),
            higher,
            lower,
            ties,
            p_value,
            holds: p_value < SIGNIFICANCE,
        })
    }

    /// The mark the table shows: `▲k/n` or `▼k/n`, then ` holds` when it does.
    fn mark(&self) -> String {
        let n = self.higher + self.lower + self.ties;
        let (arrow, k) = if self.higher >= self.lower {
            ("▲", self.higher)
        } else {
            ("▼", self.lower)
        };
        let holds = if self.holds { " holds" } else { "" };
        format!(" {arrow}{k}/{n}{holds}")
    }
}

/// The two-sided exact sign-test p-value of `a` against `b` (each ½ under
/// no difference): twice the smaller tail, at most 1; 1 when `a + b = 0`.
pub fn sign_test_p(a: u64, b: u64) -> f64 {
    let n = a + b;
    let k = a.min(b);
    // Log-space so that ½ⁿ does not underflow for large n.
    let mut ln_pmf = -(n as f64) * std::f64::consts::LN_2;
    let mut tail = 0.0;
    for i in 0..=k {
        tail += ln_pmf.exp();
        ln_pmf += ((n - i) as f64).ln() - ((i + 1) as f64).ln();
    }
    (2.0 * tail).min(1.0)
}

/// One variant: its name and its seeds' records (in seed order, one per
/// seed, a failed simulation's included).
#[derive(Clone, Debug)]
pub struct Variant {
    /// The file, or `key=value` for a `--set` variant.
    pub name: String,
    /// Per seed, in seed order.
    pub records: Vec<SeedRecord>,
}

/// The result of a comparison.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// Always `"compare"`: what `merge` reads this as.
    pub command: &'static str,
    /// The seeds, `[from, to)`.
    pub seeds: [u64; 2],
    /// Which shard of the seeds this is (null: all of them).
    pub shard: Option<Shard>,
    /// What `compare` prints before the runs: each variant's load line
    /// (what its limiter limits, each server's offered load against its
    /// capacity); `merge` prints it again.
    pub preamble: String,
    /// A digest of every variant's scenario
    /// ([`digest`](crate::scenario::Scenario::digest), in order): shards of
    /// one comparison ran the same settings. Empty until the command sets it.
    pub digest: String,
    /// Per variant, in the order given: its name and its sweep summary.
    pub variants: Vec<(String, SweepSummary)>,
    /// Every later variant against the first, figure by figure.
    pub differences: Vec<SignTest>,
}

impl Comparison {
    /// Compares `variants` run over seeds `from..to` (those of `shard`).
    ///
    /// A whole-run figure is paired seed by seed; a fault episode's figure
    /// is paired seed by seed between the episodes of the same name
    /// ([`episode_name`](crate::judgement::sweep::episode_name)), over the
    /// seeds where both variants had that episode and measured the figure.
    pub fn new(from: u64, to: u64, shard: Option<Shard>, preamble: String, variants: &[Variant]) -> Comparison {
        let summaries: Vec<(String, SweepSummary)> = variants
            .iter()
            .map(|v| (v.name.clone(), SweepSummary::of_records(v.records.clone())))
            .collect();
        let mut differences = Vec::new();
        if let Some((first, rest)) = variants.split_first() {
            let episodes = episode_names(&summaries);
            for v in rest {
                let seeds = || first.records.iter().zip(&v.records);
                for figure in FIGURE_NAMES {
                    let pairs = seeds().filter_map(|(a, b)| Some((*a.figures.get(figure)?, *b.figures.get(figure)?)));
                    differences.extend(SignTest::of(figure, None, &v.name, pairs));
                }
                differences.extend(group_tests(
                    first,
                    v,
                    &server_names(&summaries),
                    |r| &r.servers,
                    &SERVER_FIGURE_NAMES,
                    |t, server| t.server = Some(server),
                ));
                differences.extend(group_tests(
                    first,
                    v,
                    &class_names(&summaries),
                    |r| &r.classes,
                    &CLASS_FIGURE_NAMES,
                    |t, class| t.class = Some(class),
                ));
                for (_, episode) in &episodes {
                    let of = |r: &SeedRecord, figure: &str| {
                        r.episodes
                            .iter()
                            .find(|e| e.episode == *episode)
                            .and_then(|e| e.figures.get(figure).copied())
                    };
                    for figure in EPISODE_FIGURE_NAMES {
                        let pairs = seeds().filter_map(|(a, b)| Some((of(a, figure)?, of(b, figure)?)));
                        differences.extend(SignTest::of(figure, Some(episode), &v.name, pairs));
                    }
                }
            }
        }
        Comparison {
            command: "compare",
            seeds: [from, to],
            shard,
            preamble,
            digest: String::new(),
            variants: summaries,
            differences,
        }
    }

    /// The side-by-side table, as `compare` prints it: the whole-run
    /// figures, then each fault episode's.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\ncompare over seeds {}..{}: median [min – max] per variant; against the first, ▲ higher / ▼ lower in k of n seeds, \"holds\" when a paired sign test gives p < {SIGNIFICANCE}",
            self.seeds[0], self.seeds[1]
        );
        for (i, (name, _)) in self.variants.iter().enumerate() {
            let _ = writeln!(out, "  [{}] {name}", i + 1);
        }
        for figure in FIGURE_NAMES {
            self.row(&mut out, figure, Scope::Run, |s| s.figures.get(figure));
        }
        if self.variants.iter().any(|(name, _)| self.limiter_differs(name)) {
            let _ = writeln!(
                out,
                "  (limiter): the limiter deferred a different number of calls in that variant ({DEFERRED} holds), so it offered the servers a different load: the difference may be calls held back, not served better"
            );
        }
        let servers = server_names(&self.variants);
        if !servers.is_empty() {
            let _ = writeln!(out, "  per server (where the requests went):");
        }
        for server in &servers {
            for figure in SERVER_FIGURE_NAMES {
                self.row(&mut out, figure, Scope::Server(server), |s| {
                    s.servers.get(server).and_then(|f| f.get(figure))
                });
            }
        }
        let classes = class_names(&self.variants);
        if !classes.is_empty() {
            let _ = writeln!(out, "  per priority class (how its calls fared):");
        }
        for class in &classes {
            for figure in CLASS_FIGURE_NAMES {
                self.row(&mut out, figure, Scope::Class(class), |s| {
                    s.classes.get(class).and_then(|f| f.get(figure))
                });
            }
        }
        for (_, episode) in episode_names(&self.variants) {
            let _ = write!(out, "  episode {episode}:");
            for (i, (_, summary)) in self.variants.iter().enumerate() {
                let seeds = summary
                    .episodes
                    .iter()
                    .find(|e| e.episode == episode)
                    .map_or(0, |e| e.seeds);
                let _ = write!(out, "  [{}] {seeds} of {} seeds", i + 1, summary.seeds);
            }
            out.push('\n');
            for figure in EPISODE_FIGURE_NAMES {
                self.row(&mut out, figure, Scope::Episode(&episode), |s| {
                    s.episodes
                        .iter()
                        .find(|e| e.episode == episode)
                        .and_then(|e| e.figures.get(figure))
                });
            }
        }
        out
    }

    /// Whether the limiter deferred a different number of calls in
    /// `variant` than in the first, across seeds: its other whole-run
    /// figures are then of a different offered load, and a difference in
    /// them may be the limiter holding calls back rather than a gain.
    fn limiter_differs(&self, variant: &str) -> bool {
        self.differences.iter().any(|d| {
            d.figure == DEFERRED && d.episode.is_none() && d.server.is_none() && d.variant == variant && d.holds
        })
    }

    /// One figure's row: each variant's cell and its mark against the
    /// first. A row no variant measured is left out for an episode's figure.
    fn row<'s>(
        &'s self,
        out: &mut String,
        figure: &str,
        scope: Scope<'_>,
        get: impl Fn(&'s SweepSummary) -> Option<&'s Distribution>,
    ) {
        let (episode, server, class) = match scope {
            Scope::Run => (None, None, None),
            Scope::Episode(e) => (Some(e), None, None),
            Scope::Server(s) => (None, Some(s), None),
            Scope::Class(c) => (None, None, Some(c)),
        };
        if scope != Scope::Run && self.variants.iter().all(|(_, s)| get(s).is_none()) {
            return;
        }
        let label = server
            .or(class)
            .map_or_else(|| figure.to_owned(), |s| format!("{s} {figure}"));
        let (indent, width) = match scope {
            Scope::Run => ("  ", 22),
            Scope::Episode(_) => ("    ", 20),
            Scope::Server(_) | Scope::Class(_) => ("    ", 28),
        };
        let _ = write!(out, "{indent}{label:<width$}");
        for (i, (name, summary)) in self.variants.iter().enumerate() {
            let cell = get(summary).map_or("-".to_owned(), |d| {
                format!("{} [{} – {}]", round(d.median), round(d.min), round(d.max))
            });
            let test = self.differences.iter().find(|d| {
                d.figure == figure
                    && d.episode.as_deref() == episode
                    && d.server.as_deref() == server
                    && d.class.as_deref() == class
                    && d.variant == *name
            });
            let mut mark = test.map_or(String::new(), SignTest::mark);
            if scope == Scope::Run && figure != DEFERRED && test.is_some_and(|t| t.holds) && self.limiter_differs(name)
            {
                mark.push_str(" (limiter)");
            }
            let _ = write!(out, "  [{}] {cell}{mark}", i + 1);
        }
        out.push('\n');
    }
}

/// What a row of the table is a figure of.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope<'a> {
    /// The whole run.
    Run,
    /// One fault episode, by name.
    Episode(&'a str),
    /// One model server, by name.
    Server(&'a str),
    /// One priority class, by name.
    Class(&'a str),
}

/// Every priority class any variant measured, by name.
fn class_names(variants: &[(String, SweepSummary)]) -> Vec<String> {
    group_names(variants, |s| s.classes.keys())
}

/// Every model server any variant's requests reached, by name.
fn server_names(variants: &[(String, SweepSummary)]) -> Vec<String> {
    group_names(variants, |s| s.servers.keys())
}

/// The names of the groups (servers, classes) any variant measured, sorted.
fn group_names<'a, K: Iterator<Item = &'a String>>(
    variants: &'a [(String, SweepSummary)],
    keys: impl Fn(&'a SweepSummary) -> K,
) -> Vec<String> {
    let names: std::collections::BTreeSet<&String> = variants.iter().flat_map(|(_, s)| keys(s)).collect();
    names.into_iter().cloned().collect()
}

/// Variant `v`'s sign tests against `first` on each of `groups`' figures
/// named in `names` (a group's figures picked from a seed's record by
/// `pick`), each marked with its group by `mark`.
fn group_tests(
    first: &Variant,
    v: &Variant,
    groups: &[String],
    pick: impl Fn(&SeedRecord) -> &std::collections::BTreeMap<String, std::collections::BTreeMap<String, f64>>,
    names: &[&'static str],
    mark: impl Fn(&mut SignTest, String),
) -> Vec<SignTest> {
    let mut tests = Vec::new();
    for group in groups {
        let of = |r: &SeedRecord, figure: &str| pick(r).get(group).and_then(|f| f.get(figure).copied());
        for &figure in names {
            let pairs = first
                .records
                .iter()
                .zip(&v.records)
                .filter_map(|(a, b)| Some((of(a, figure)?, of(b, figure)?)));
            if let Some(mut t) = SignTest::of(figure, None, &v.name, pairs) {
                mark(&mut t, group.clone());
                tests.push(t);
            }
        }
    }
    tests
}

/// Every fault episode any variant had, as `(index, name)`, ordered by
/// index then name.
fn episode_names(variants: &[(String, SweepSummary)]) -> Vec<(u64, String)> {
    let names: std::collections::BTreeSet<(u64, String)> = variants
        .iter()
        .flat_map(|(_, s)| s.episodes.iter().map(|e| (e.index, e.episode.clone())))
        .collect();
    names.into_iter().collect()
}

fn round(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_test_p_values_are_exact_binomial_tails() {
        // 10 of 10 one way: 2 × ½¹⁰.
        assert!((sign_test_p(10, 0) - 2.0 / 1024.0).abs() < 1e-12);
        // 8 of 10: 2 × (1 + 10 + 45) / 1024.
        assert!((sign_test_p(8, 2) - 2.0 * 56.0 / 1024.0).abs() < 1e-12);
        assert_eq!(sign_test_p(5, 5), 1.0);
        assert_eq!(sign_test_p(0, 0), 1.0);
        // Large n: no NaN from 0 × ∞ or an overflowing binomial coefficient.
        let p = sign_test_p(2000, 0);
        assert!((0.0..1e-100).contains(&p), "{p}");
    }

    #[test]
    fn episode_figures_are_paired_by_episode_name_over_the_seeds_that_had_it() {
        use crate::judgement::sweep::EpisodeRecord;
        // Seed s: episode #1 with `requests_reached` = base + s, except
        // that variant b's seed 3 lacks the episode.
        let record = |seed: u64, reached: Option<f64>| SeedRecord {
            seed,
            episodes: reached
                .map(|v| EpisodeRecord {
                    index: 1,
                    episode: "#1 gpu crash at 5.0 s".into(),
                    figures: [("requests_reached".to_owned(), v)].into(),
                })
                .into_iter()
                .collect(),
            ..SeedRecord::default()
        };
        let a = Variant {
            name: "a".into(),
            records: (1..9).map(|s| record(s, Some(s as f64))).collect(),
        };
        let b = Variant {
            name: "b".into(),
            records: (1..9).map(|s| record(s, (s != 3).then_some(s as f64 + 1.0))).collect(),
        };
        let c = Comparison::new(1, 9, None, String::new(), &[a, b]);
        let d: Vec<&SignTest> = c.differences.iter().filter(|d| d.episode.is_some()).collect();
        assert_eq!(d.len(), 1, "{d:?}");
        // Seven seeds had the episode in both, each one higher in b.
        assert_eq!(
            (d[0].figure, d[0].episode.as_deref(), d[0].higher, d[0].lower, d[0].ties),
            ("requests_reached", Some("#1 gpu crash at 5.0 s"), 7, 0, 0)
        );
        assert!(d[0].holds);
        let text = c.render();
        assert!(
            text.contains("  episode #1 gpu crash at 5.0 s:  [1] 8 of 8 seeds  [2] 7 of 8 seeds\n    requests_reached      [1] 4 [1 – 8]  [2] 6 [2 – 9] ▲7/7 holds\n"),
            "{text}"
        );
        // In JSON the difference names its episode.
        let json = serde_json::to_value(d[0]).unwrap();
        assert_eq!(json["episode"], "#1 gpu crash at 5.0 s");
    }

    #[test]
    fn a_difference_that_comes_with_more_calls_deferred_is_marked_as_the_limiters() {
        // Variant b defers 50 more calls on every seed and so sends fewer
        // requests to the impaired server: not a win of its hardening.
        let record = |seed: u64, deferred: f64, impaired: f64, p50: f64| SeedRecord {
            seed,
            figures: [
                ("calls_deferred".to_owned(), deferred),
                ("impaired_requests".to_owned(), impaired),
                ("latency_p50_s".to_owned(), p50),
            ]
            .into(),
            ..SeedRecord::default()
        };
        let a = Variant {
            name: "a".into(),
            records: (1..9).map(|s| record(s, 0.0, 40.0 + s as f64, 1.0)).collect(),
        };
        let b = Variant {
            name: "b".into(),
            records: (1..9).map(|s| record(s, 50.0, 10.0 + s as f64, 1.0)).collect(),
        };
        let text = Comparison::new(1, 9, None, String::new(), &[a.clone(), b]).render();
        assert!(text.contains("▼8/8 holds (limiter)"), "{text}");
        assert!(
            text.contains("  (limiter): the limiter deferred a different number"),
            "{text}"
        );
        // The deferred row itself, and a figure that does not differ, are
        // not marked.
        assert!(text.contains("▲8/8 holds\n"), "{text}");
        // The same drop with the limiter unchanged is unmarked.
        let c = Variant {
            name: "c".into(),
            records: (1..9).map(|s| record(s, 0.0, 10.0 + s as f64, 1.0)).collect(),
        };
        let text = Comparison::new(1, 9, None, String::new(), &[a, c]).render();
        assert!(text.contains("▼8/8 holds\n") && !text.contains("(limiter)"), "{text}");
    }

    #[test]
    fn set_field_changes_one_field_making_tables_and_indexing_arrays() {
        let text = "name = \"x\"\n[hardening]\nrpm = 60\n[[servers]]\nname = \"gpu\"\n";
        let got: toml::Table = toml::from_str(&set_field(text, "hardening.failure_threshold", "3").unwrap()).unwrap();
        assert_eq!(got["hardening"]["failure_threshold"].as_integer(), Some(3));
        assert_eq!(got["hardening"]["rpm"].as_integer(), Some(60));
        let got: toml::Table = toml::from_str(&set_field(text, "cache.kind", "shared").unwrap()).unwrap();
        assert_eq!(got["cache"]["kind"].as_str(), Some("shared"));
        let got: toml::Table = toml::from_str(&set_field(text, "servers.0.slots", "8").unwrap()).unwrap();
        assert_eq!(got["servers"][0]["slots"].as_integer(), Some(8));
        // Into a string, or past the end of an array: the error names the step.
        assert_eq!(
            set_field(text, "name.first", "1"),
            Err(SetError::Path {
                key: "name.first".into(),
                at: "first".into()
            })
        );
        assert_eq!(
            set_field(text, "servers.3.slots", "1"),
            Err(SetError::Path {
                key: "servers.3.slots".into(),
                at: "3".into()
            })
        );
    }

    fn pairs(setting: &[(String, String)]) -> Vec<String> {
        setting.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }

    #[test]
    fn several_sets_make_every_combination_the_first_varying_slowest() {
        let d = design(&["a=1,2", "b=x,y,z", "c.d=true"]).unwrap();
        let got: Vec<Vec<String>> = d.iter().map(|s| pairs(s)).collect();
        let want: Vec<Vec<String>> = [
            ["a=1", "b=x", "c.d=true"],
            ["a=1", "b=y", "c.d=true"],
            ["a=1", "b=z", "c.d=true"],
            ["a=2", "b=x", "c.d=true"],
            ["a=2", "b=y", "c.d=true"],
            ["a=2", "b=z", "c.d=true"],
        ]
        .iter()
        .map(|r| r.iter().map(|p| p.to_string()).collect())
        .collect();
        assert_eq!(got, want);
        // One --set: its values in order, as before.
        let one = design(&["hardening.failure_threshold=1,3,5"]).unwrap();
        assert_eq!(
            one.iter().map(|s| setting_name(s)).collect::<Vec<_>>(),
            [
                "hardening.failure_threshold=1",
                "hardening.failure_threshold=3",
                "hardening.failure_threshold=5"
            ]
        );
        assert!(design::<&str>(&[]).unwrap().is_empty());
    }

    #[test]
    fn a_combination_is_named_by_its_pairs_joined_by_a_space_each_a_shell_word() {
        let d = design(&["hardening.failure_threshold=1", "hardening.recovery_timeout_s=10"]).unwrap();
        assert_eq!(
            setting_name(&d[0]),
            "hardening.failure_threshold=1 hardening.recovery_timeout_s=10"
        );
        assert_eq!(
            setting_flags(&d[0]),
            "--set hardening.failure_threshold=1 --set hardening.recovery_timeout_s=10"
        );
        // A value with a space is quoted in a combination's name, so the
        // pairs stay apart; alone it is named as it always was.
        let d = design(&["servers.0.behaviour={ mode = \"error\" }", "b=2"]).unwrap();
        assert_eq!(setting_name(&d[0]), "'servers.0.behaviour={ mode = \"error\" }' b=2");
        let d = design(&["servers.0.behaviour={ mode = \"error\" }"]).unwrap();
        assert_eq!(setting_name(&d[0]), "servers.0.behaviour={ mode = \"error\" }");
    }

    #[test]
    fn a_replay_is_a_command_to_paste_run_for_a_file_compare_for_a_set() {
        assert_eq!(replay("a b.toml", &[], 4), "redstring-sim run 'a b.toml' --seed 4");
        let d = design(&[
            "hardening.failure_threshold=3",
            "servers.0.behaviour={ mode = \"error\" }",
        ])
        .unwrap();
        assert_eq!(
            replay("s.toml", &d[0], 7),
            "redstring-sim compare s.toml --set hardening.failure_threshold=3 --set 'servers.0.behaviour={ mode = \"error\" }' --seeds 7..=7"
        );
    }

    #[test]
    fn a_design_applies_every_key_of_a_combination() {
        let text = "name = \"x\"\n[hardening]\nrpm = 60\n";
        let d = design(&["hardening.rpm=30,90", "hardening.failure_threshold=2"]).unwrap();
        let got: toml::Table = toml::from_str(&apply(text, &d[1]).unwrap()).unwrap();
        assert_eq!(got["hardening"]["rpm"].as_integer(), Some(90));
        assert_eq!(got["hardening"]["failure_threshold"].as_integer(), Some(2));
        assert_eq!(got["name"].as_str(), Some("x"));
    }

    #[test]
    fn a_key_given_twice_or_too_many_variants_is_refused_naming_it() {
        let e = design(&["a=1,2", "b=1", " a =3"]).unwrap_err();
        assert_eq!(e, SetError::Duplicate("a".into()));
        assert!(e.to_string().contains("--set a is given twice"), "{e}");
        // 8 × 9 = 72 > 64.
        let eight = (1..=8).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        let nine = (1..=9).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        let e = design(&[format!("a={eight}"), format!("b={nine}")]).unwrap_err();
        assert_eq!(
            e,
            SetError::TooManyVariants {
                counts: vec![8, 9],
                product: Some(72)
            }
        );
        assert!(
            e.to_string()
                .contains("8 × 9 values make 72 variants, more than the 64"),
            "{e}"
        );
        // 8 × 8 = 64 is allowed.
        assert_eq!(design(&[format!("a={eight}"), format!("b={eight}")]).unwrap().len(), 64);
        // A product past usize is refused without overflow or allocation.
        let mut sets = vec!["k=1,2".to_owned()];
        for i in 0..70 {
            sets.push(format!("k{i}=1,2,3"));
        }
        let e = design(&sets).unwrap_err();
        assert!(matches!(e, SetError::TooManyVariants { product: None, .. }), "{e:?}");
        assert!(e.to_string().contains("too many to count"), "{e}");
        // One --set is bounded only by what is written out.
        let hundred = (1..=100).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        assert_eq!(design(&[format!("a={hundred}")]).unwrap().len(), 100);
    }

    #[test]
    fn set_parses_key_and_values() {
        assert_eq!(
            parse_set("hardening.failure_threshold=1,3,5").unwrap(),
            (
                "hardening.failure_threshold".to_owned(),
                vec!["1".into(), "3".into(), "5".into()]
            )
        );
        assert!(matches!(parse_set("no-equals"), Err(SetError::Syntax(_))));
        assert!(matches!(parse_set("a..b=1"), Err(SetError::Syntax(_))));
        assert!(matches!(parse_set("a=1,,2"), Err(SetError::Syntax(_))));
    }
}
