//! The `--vary` dimensions: a dotted key and the values it takes
//! (integers, decimals, steps or a list), and checking them against the
//! scenario before any simulation.

use super::*;

/// The values one dimension takes.
#[derive(Clone, Debug, PartialEq)]
pub enum Spec {
    /// Every integer from `lo` to `hi`, both included.
    Ints {
        /// The smallest.
        lo: i64,
        /// The largest.
        hi: i64,
    },
    /// `lo`, `lo + step`, … up to `hi` (included when on a step).
    Steps {
        /// The smallest.
        lo: f64,
        /// The step.
        step: f64,
        /// How many values.
        count: u64,
        /// Decimal places to print (those of `lo` and `step`).
        decimals: usize,
    },
    /// Any value from `lo` to `hi`, rounded to [`DECIMALS`] places.
    Reals {
        /// The smallest.
        lo: f64,
        /// The largest.
        hi: f64,
    },
    /// These values, each read as TOML as `--set` reads it.
    List(Vec<String>),
}

/// One varied key: a dotted TOML key, as `compare --set` takes it, and its values.
#[derive(Clone, Debug, PartialEq)]
pub struct Dim {
    /// The dotted key (`hardening.failure_threshold`).
    pub key: String,
    /// Its values.
    pub spec: Spec,
}

/// Most values a stepped or integer range may have (a larger one is a
/// typo, not a design).
pub const MAX_LEVELS: u64 = 1_000_000;

pub(super) fn decimals_of(text: &str) -> usize {
    text.split_once('.').map_or(0, |(_, d)| d.len())
}

/// `v` to `decimals` places, trailing zeros dropped but one kept after the
/// point: TOML reads `3` as an integer, and a decimal range stays a float.
pub(super) fn format_decimal(v: f64, decimals: usize) -> String {
    let s = format!("{v:.decimals$}");
    match s.split_once('.') {
        None => format!("{s}.0"),
        Some((whole, frac)) => {
            let frac = frac.trim_end_matches('0');
            format!("{whole}.{}", if frac.is_empty() { "0" } else { frac })
        }
    }
}

impl Dim {
    /// Parses `KEY=SPEC`.
    pub fn parse(arg: &str) -> Result<Dim, TuneError> {
        let bad = |why: &str| TuneError::Syntax {
            arg: arg.to_owned(),
            why: why.to_owned(),
        };
        let (key, spec) = arg.split_once('=').ok_or_else(|| bad("no `=`"))?;
        let (key, spec) = (key.trim(), spec.trim());
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(bad("the key is empty or has an empty step"));
        }
        let spec = if let Some((lo, rest)) = spec.split_once("..") {
            let (hi, step) = match rest.split_once(':') {
                Some((hi, step)) => (hi.trim(), Some(step.trim())),
                None => (rest.trim(), None),
            };
            let lo = lo.trim();
            let integral = |t: &str| t.parse::<i64>().ok();
            match (integral(lo), integral(hi), step) {
                (Some(lo), Some(hi), None) => {
                    if lo > hi {
                        return Err(bad("lo is above hi"));
                    }
                    Spec::Ints { lo, hi }
                }
                _ => {
                    let num = |t: &str, what: &str| {
                        t.parse::<f64>()
                            .ok()
                            .filter(|v| v.is_finite())
                            .ok_or_else(|| bad(&format!("{what} {t:?} is not a finite number")))
                    };
                    let (l, h) = (num(lo, "lo")?, num(hi, "hi")?);
                    if l > h {
                        return Err(bad("lo is above hi"));
                    }
                    match step {
                        None => Spec::Reals { lo: l, hi: h },
                        Some(st) => {
                            let s = num(st, "step")?;
                            if s <= 0.0 {
                                return Err(bad("the step must be above 0"));
                            }
                            // A tolerance of a millionth of a step, so that
                            // 0.1..0.3:0.1 includes 0.3.
                            let steps = ((h - l) / s + 1e-6).floor();
                            if steps >= MAX_LEVELS as f64 {
                                return Err(bad(&format!("more than {MAX_LEVELS} values")));
                            }
                            Spec::Steps {
                                lo: l,
                                step: s,
                                count: steps as u64 + 1,
                                decimals: decimals_of(lo).max(decimals_of(st)),
                            }
                        }
                    }
                }
            }
        } else {
            let values: Vec<String> = spec.split(',').map(|v| v.trim().to_owned()).collect();
            if values.iter().any(String::is_empty) {
                return Err(bad("an empty value in the list"));
            }
            Spec::List(values)
        };
        if let Spec::Ints { lo, hi } = spec
            && hi.abs_diff(lo) >= MAX_LEVELS
        {
            return Err(bad(&format!("more than {MAX_LEVELS} values")));
        }
        Ok(Dim {
            key: key.to_owned(),
            spec,
        })
    }

    /// How many values the dimension has; `None` for a continuous range.
    pub fn levels(&self) -> Option<u64> {
        match &self.spec {
            Spec::Ints { lo, hi } => Some(hi.abs_diff(*lo) + 1),
            Spec::Steps { count, .. } => Some(*count),
            Spec::Reals { .. } => None,
            Spec::List(v) => Some(v.len() as u64),
        }
    }

    /// The `i`th value of a discrete dimension (`i < levels`).
    pub(super) fn level(&self, i: u64) -> String {
        match &self.spec {
            Spec::Ints { lo, .. } => (lo + i as i64).to_string(),
            Spec::Steps { lo, step, decimals, .. } => format_decimal(lo + step * i as f64, *decimals),
            Spec::Reals { lo, .. } => format_decimal(*lo, DECIMALS),
            Spec::List(v) => v[i as usize].clone(),
        }
    }

    /// The value at `u` in `[0, 1)` of the dimension's range: the level
    /// whose equal share of `[0, 1)` holds `u`, or a continuous range's
    /// point, rounded.
    pub(super) fn at(&self, u: f64) -> String {
        match (&self.spec, self.levels()) {
            (Spec::Reals { lo, hi }, _) => format_decimal(lo + (hi - lo) * u, DECIMALS),
            (_, Some(n)) => self.level(((u * n as f64) as u64).min(n - 1)),
            (_, None) => unreachable!("only a continuous range has no levels"),
        }
    }

    /// The values that bound the dimension, each checked against the
    /// scenario before any simulation: every level of a discrete one, the
    /// ends of a continuous one.
    pub(super) fn checked_values(&self) -> Vec<String> {
        match (&self.spec, self.levels()) {
            (Spec::Reals { lo, hi }, _) => vec![format_decimal(*lo, DECIMALS), format_decimal(*hi, DECIMALS)],
            (_, Some(n)) if n <= 64 => (0..n).map(|i| self.level(i)).collect(),
            (_, Some(n)) => vec![self.level(0), self.level(n - 1)],
            (_, None) => Vec::new(),
        }
    }
}

/// What the tune starts from: the scenario's text and its parsed form.
pub struct Base<'a> {
    /// The file, as shown in messages.
    pub file: &'a str,
    /// The file's text.
    pub text: &'a str,
    /// The parsed scenario (its objectives are what the tune judges by).
    pub scenario: &'a Scenario,
}

impl Base<'_> {
    /// The scenario text with `values` set at `dims`' keys.
    pub(super) fn text_with(&self, dims: &[Dim], values: &[String]) -> Result<String, SetError> {
        let mut text = self.text.to_owned();
        for (d, v) in dims.iter().zip(values) {
            text = set_field(&text, &d.key, v)?;
        }
        Ok(text)
    }

    /// The scenario with `values` set, validated; an error says why not.
    pub(super) fn scenario_with(&self, dims: &[Dim], values: &[String]) -> Result<Scenario, String> {
        let text = self.text_with(dims, values).map_err(|e| e.to_string())?;
        let keys: Vec<&str> = dims.iter().map(|d| d.key.as_str()).collect();
        let (scenario, warnings) =
            Scenario::parse_varied(self.file, self.text, &text, &keys).map_err(|e| e.to_string())?;
        // A candidate under which no call can succeed would meet objectives
        // by measuring nothing (no call, no failure): it is refused.
        if let Some(w) = warnings
            .iter()
            .find(|w| matches!(w.odd, crate::scenario::sanity::Oddity::NoCallCanSucceed { .. }))
        {
            return Err(format!("{}: {}", w.field, w.odd));
        }
        Budget::DEFAULT.check(&scenario).map_err(|e| e.to_string())?;
        Ok(scenario)
    }
}

/// Checks what can be checked before any simulation: at least one
/// dimension, no key twice, objectives set, and every bounding value of
/// every dimension accepted by the scenario on its own.
pub fn precheck(base: &Base<'_>, dims: &[Dim]) -> Result<(), TuneError> {
    if dims.is_empty() {
        return Err(TuneError::NothingVaried);
    }
    for (i, d) in dims.iter().enumerate() {
        if dims[..i].iter().any(|e| e.key == d.key) {
            return Err(TuneError::Twice(d.key.clone()));
        }
    }
    if base.scenario.objectives.is_empty() {
        return Err(TuneError::NoObjectives(base.file.to_owned()));
    }
    if let Some(d) = dims
        .iter()
        .find(|d| d.key == "objectives" || d.key.starts_with("objectives."))
    {
        return Err(TuneError::VariesObjective(d.key.clone()));
    }
    for d in dims {
        for value in d.checked_values() {
            base.scenario_with(std::slice::from_ref(d), std::slice::from_ref(&value))
                .map_err(|why| TuneError::Refused {
                    key: d.key.clone(),
                    value,
                    why,
                })?;
        }
    }
    Ok(())
}
