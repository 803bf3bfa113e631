//! Merging: the `--json` of every shard of one sweep, comparison, fuzz run
//! or tune round joined into the result one machine would have given.
//!
//! `redstring-sim merge` reads every shard's JSON ([`merge`]), checks they
//! are the `n` shards of one run (same command, scenario or variants, seeds
//! and `n`; each shard once), puts the records back in seed order and makes
//! the summary from them as an unsharded run does: the text and the JSON are
//! byte for byte those of the run on one machine. A fuzz run's shards split
//! its cases the same way; how they are joined is
//! [`crate::search::fuzz_run`]'s. A tune's shards split each rung's
//! simulations, a merge after every rung ([`crate::search::tune_shard`]).
//! It sits above every command's result, so it is the one module that knows
//! them all.

use serde::Deserialize;

use crate::campaign::MAX_SEEDS;
use crate::judgement::compare::{Comparison, Variant};
use crate::judgement::shard::{Shard, ShardError};
use crate::judgement::sweep::{SeedRecord, SweepRun, SweepSummary};
use crate::search::fuzz_run::{FuzzOutcome, FuzzRun};
use crate::search::tune_shard::Joined;

/// What `merge` gives back: the joined sweep, comparison or fuzz run.
#[derive(Clone, Debug, PartialEq)]
pub enum Merged {
    /// A sweep's shards, joined.
    Sweep(SweepRun),
    /// A comparison's shards, joined.
    Compare(Comparison),
    /// A fuzz run's shards, joined (its failing case is still to be
    /// written, as `fuzz` writes it).
    Fuzz(FuzzRun),
    /// One round of a tune's shards, joined: its result, or the state for
    /// the next round.
    Tune(Joined),
}

impl Merged {
    /// The text the unsharded command prints (after its preamble, which a
    /// sweep carries).
    pub fn render(&self) -> String {
        match self {
            Merged::Sweep(s) => format!("{}{}", s.preamble, s.render()),
            Merged::Compare(c) => format!("{}{}", c.preamble, c.render()),
            Merged::Fuzz(f) => f.render(),
            Merged::Tune(Joined::Done { tuning, dims, .. }) => tuning.render(dims),
            Merged::Tune(Joined::Next(state)) => format!(
                "tune {}: rung {} is next; run it on each machine with --resume and this state, then merge again\n",
                state.scenario, state.rung
            ),
        }
    }

    /// The JSON the unsharded command writes.
    pub fn to_json(&self) -> String {
        match self {
            Merged::Sweep(s) => serde_json::to_string_pretty(s),
            Merged::Compare(c) => serde_json::to_string_pretty(c),
            Merged::Fuzz(f) => serde_json::to_string_pretty(f),
            Merged::Tune(Joined::Done { tuning, .. }) => serde_json::to_string_pretty(tuning),
            Merged::Tune(Joined::Next(state)) => serde_json::to_string_pretty(state),
        }
        .unwrap_or_default()
    }

    /// Whether a seed failed (a fuzz case broke an invariant), and whether
    /// one missed an objective.
    pub fn verdict(&self) -> (bool, bool) {
        match self {
            Merged::Fuzz(f) => (matches!(f.outcome, FuzzOutcome::Failed { .. }), false),
            Merged::Tune(Joined::Done { tuning, .. }) => (tuning.broke(), !tuning.met()),
            Merged::Tune(Joined::Next(_)) => (false, false),
            Merged::Sweep(s) => s.verdict(),
            Merged::Compare(c) => {
                let recs = || c.variants.iter().flat_map(|(_, s)| s.per_seed.iter());
                (
                    recs().any(SeedRecord::is_failure),
                    recs().any(|r| !r.missed_objectives().is_empty()),
                )
            }
        }
    }
}

/// The fields every shard shares, read from its JSON.
#[derive(Deserialize)]
struct Header {
    command: String,
    shard: Option<Shard>,
}

#[derive(Deserialize)]
struct SweepFile {
    scenario: String,
    seed_range: [u64; 2],
    shard: Option<Shard>,
    preamble: String,
    #[serde(default)]
    digest: String,
    per_seed: Vec<SeedRecord>,
}

#[derive(Deserialize)]
struct VariantSummary {
    per_seed: Vec<SeedRecord>,
}

#[derive(Deserialize)]
struct CompareFile {
    seeds: [u64; 2],
    shard: Option<Shard>,
    preamble: String,
    #[serde(default)]
    digest: String,
    variants: Vec<(String, VariantSummary)>,
}

/// Why two shards' scenario digests differing refuses them.
fn edited(mine: &str, first: &str) -> String {
    format!(
        "it ran scenario settings with digest {mine:?}, the first file's {first:?}: was the scenario edited between shards? Run every shard on the same file"
    )
}

/// Joins the shards' JSON (`(file, text)` each) into the unsharded result.
pub fn merge(files: &[(String, String)]) -> Result<Merged, ShardError> {
    let not = |file: &str, e: serde_json::Error| ShardError::NotAShard {
        file: file.to_owned(),
        why: e.to_string(),
    };
    let mismatch = |file: &str, why: String| ShardError::Mismatch {
        file: file.to_owned(),
        why,
    };
    let Some((first_file, first_text)) = files.first() else {
        return Err(ShardError::Nothing);
    };
    let first: Header = serde_json::from_str(first_text).map_err(|e| not(first_file, e))?;
    let count = first.shard.map_or(1, |s| s.count);
    let mut seen = vec![false; usize::try_from(count).unwrap_or(usize::MAX).min(1 << 20)];
    for (file, text) in files {
        let h: Header = serde_json::from_str(text).map_err(|e| not(file, e))?;
        if h.command != first.command {
            return Err(mismatch(
                file,
                format!("a {} among {}'s shards", h.command, first.command),
            ));
        }
        let (index, n) = h.shard.map_or((1, 1), |s| (s.index, s.count));
        if index == 0 || index > n {
            return Err(mismatch(file, format!("shard {index} of {n} is not a shard")));
        }
        if n != count {
            return Err(mismatch(file, format!("shard of {n}, the first file's of {count}")));
        }
        let slot = seen
            .get_mut(usize::try_from(index - 1).unwrap_or(usize::MAX))
            .ok_or_else(|| mismatch(file, format!("shard {index} of {n}")))?;
        if *slot {
            return Err(mismatch(file, format!("shard {index}/{n} given twice")));
        }
        *slot = true;
    }
    let missing: Vec<usize> = seen
        .iter()
        .enumerate()
        .filter(|(_, s)| !**s)
        .map(|(i, _)| i + 1)
        .collect();
    if !missing.is_empty() {
        // A handful named, the rest counted: a forged count must not make
        // a message of a million lines.
        let mut named: Vec<String> = missing.iter().take(8).map(|i| format!("{i}/{count}")).collect();
        if missing.len() > named.len() {
            named.push(format!("and {} more", missing.len() - named.len()));
        }
        return Err(ShardError::Missing(named.join(", ")));
    }
    let check_seeds = |file: &str, records: &mut Vec<SeedRecord>, from: u64, to: u64| {
        records.sort_by_key(|r| r.seed);
        let got: Vec<u64> = records.iter().map(|r| r.seed).collect();
        if got != (from..to).collect::<Vec<_>>() {
            return Err(mismatch(
                file,
                format!("the shards' seeds are not each of {from}..{to} once"),
            ));
        }
        Ok(())
    };
    // What one shard's file may hold: a seed range a command can run, and
    // only the seeds its shard owns, each record one a run can write.
    let check_part = |file: &str, [from, to]: [u64; 2], shard: Option<Shard>, records: &[SeedRecord]| {
        if from >= to || to - from > MAX_SEEDS {
            return Err(mismatch(
                file,
                format!("seeds {from}..{to} is not a range a command runs (1 to {MAX_SEEDS} seeds)"),
            ));
        }
        for r in records {
            let owned = r.seed >= from && r.seed < to && shard.is_none_or(|s| s.owns(r.seed - from));
            if !owned {
                return Err(mismatch(file, format!("seed {} is not one this shard runs", r.seed)));
            }
            r.check().map_err(|why| mismatch(file, why))?;
        }
        Ok(())
    };
    // Text a shard's file carries is printed: lines only, no other control
    // character and no bidirectional control.
    let plain = |file: &str, text: &str| {
        if text.chars().any(|c| crate::terminal::is_unsafe(c) && c != '\n') {
            return Err(mismatch(
                file,
                "it holds a control character or a bidirectional control in a name or load line".into(),
            ));
        }
        Ok(())
    };
    match first.command.as_str() {
        "sweep" => {
            let mut joined: Option<SweepFile> = None;
            for (file, text) in files {
                let f: SweepFile = serde_json::from_str(text).map_err(|e| not(file, e))?;
                check_part(file, f.seed_range, f.shard, &f.per_seed)?;
                plain(file, &f.preamble)?;
                plain(file, &f.scenario.replace('\n', "\u{0}"))?;
                match &mut joined {
                    None => joined = Some(f),
                    Some(j) => {
                        if j.preamble != f.preamble {
                            return Err(mismatch(
                                file,
                                "its load lines differ from the first file's: shards of one sweep run one scenario"
                                    .into(),
                            ));
                        }
                        if j.digest != f.digest {
                            return Err(mismatch(file, edited(&f.digest, &j.digest)));
                        }
                        if (j.scenario.as_str(), j.seed_range) != (f.scenario.as_str(), f.seed_range) {
                            return Err(mismatch(
                                file,
                                format!(
                                    "{} seeds {:?}, the first file's {} seeds {:?}",
                                    f.scenario, f.seed_range, j.scenario, j.seed_range
                                ),
                            ));
                        }
                        j.per_seed.extend(f.per_seed);
                    }
                }
            }
            let mut j = joined.ok_or(ShardError::Nothing)?;
            let [from, to] = j.seed_range;
            check_seeds(first_file, &mut j.per_seed, from, to)?;
            Ok(Merged::Sweep(SweepRun {
                command: "sweep",
                scenario: j.scenario,
                seed_range: j.seed_range,
                shard: None,
                preamble: j.preamble,
                digest: j.digest,
                summary: SweepSummary::of_records(j.per_seed),
            }))
        }
        "compare" => {
            let mut joined: Option<CompareFile> = None;
            for (file, text) in files {
                let f: CompareFile = serde_json::from_str(text).map_err(|e| not(file, e))?;
                check_part(file, f.seeds, f.shard, &[])?;
                plain(file, &f.preamble)?;
                for (name, _) in &f.variants {
                    plain(file, &name.replace('\n', "\u{0}"))?;
                }
                for (_, v) in &f.variants {
                    check_part(file, f.seeds, f.shard, &v.per_seed)?;
                }
                match &mut joined {
                    None => joined = Some(f),
                    Some(j) => {
                        let names = |c: &CompareFile| c.variants.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
                        if j.preamble != f.preamble {
                            return Err(mismatch(file, "its variants' load lines differ from the first file's: shards of one comparison run the same scenarios".into()));
                        }
                        if j.digest != f.digest {
                            return Err(mismatch(file, edited(&f.digest, &j.digest)));
                        }
                        if j.seeds != f.seeds || names(j) != names(&f) {
                            return Err(mismatch(
                                file,
                                format!(
                                    "variants {:?} over seeds {:?}, the first file's {:?} over {:?}",
                                    names(&f),
                                    f.seeds,
                                    names(j),
                                    j.seeds
                                ),
                            ));
                        }
                        for ((_, mine), (_, theirs)) in j.variants.iter_mut().zip(f.variants) {
                            mine.per_seed.extend(theirs.per_seed);
                        }
                    }
                }
            }
            let j = joined.ok_or(ShardError::Nothing)?;
            let [from, to] = j.seeds;
            let mut variants = Vec::new();
            for (name, mut v) in j.variants {
                check_seeds(first_file, &mut v.per_seed, from, to)?;
                variants.push(Variant {
                    name,
                    records: v.per_seed,
                });
            }
            let mut merged = Comparison::new(from, to, None, j.preamble, &variants);
            merged.digest = j.digest;
            Ok(Merged::Compare(merged))
        }
        "fuzz" => crate::search::fuzz_run::merge(files).map(Merged::Fuzz),
        "tune" => crate::search::tune_shard::merge(files).map(Merged::Tune),
        other => Err(ShardError::NotAShard {
            file: first_file.clone(),
            why: format!("command {other:?} cannot be merged (only sweep, compare, fuzz and tune)"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judgement::sweep::EpisodeRecord;

    fn sweep_run(shard: Option<Shard>, seeds: &[u64]) -> SweepRun {
        // Seed 2 lacks the second episode, so that a merge must count it
        // as a summary of the whole does.
        let records = seeds
            .iter()
            .map(|&s| SeedRecord {
                seed: s,
                error: None,
                figures: [("latency_p50_s".to_owned(), s as f64)].into(),
                invariants: crate::judgement::invariants::Invariant::ALL
                    .iter()
                    .map(|i| crate::judgement::sweep::Pass {
                        name: i.to_string(),
                        passed: true,
                    })
                    .collect(),
                episodes: (1..=if s == 2 { 1 } else { 2 })
                    .map(|i| EpisodeRecord {
                        index: i,
                        episode: format!("#{i} gpu crash at {}.0 s", i * 10),
                        figures: [
                            ("requests_reached".to_owned(), (s * i) as f64),
                            ("latency_during_p99_s".to_owned(), s as f64 / 3.0),
                        ]
                        .into(),
                    })
                    .collect(),
                ..SeedRecord::default()
            })
            .collect();
        SweepRun {
            command: "sweep",
            scenario: "s.toml".into(),
            seed_range: [1, 5],
            shard,
            preamble: String::new(),
            digest: "0123456789abcdef".into(),
            summary: SweepSummary::of_records(records),
        }
    }

    fn sweep_json(shard: Option<Shard>, seeds: &[u64]) -> String {
        serde_json::to_string(&sweep_run(shard, seeds)).unwrap()
    }

    #[test]
    fn a_forged_or_foreign_record_is_refused_naming_what_is_wrong() {
        let shard = |i| Some(Shard { index: i, count: 2 });
        let forge = |f: &dyn Fn(&mut SweepRun)| {
            let mut one = sweep_run(shard(1), &[1, 3]);
            f(&mut one);
            let two = sweep_json(shard(2), &[2, 4]);
            merge(&[
                ("a.json".into(), serde_json::to_string(&one).unwrap()),
                ("b.json".into(), two),
            ])
        };
        let why = |r: Result<Merged, ShardError>| match r {
            Err(ShardError::Mismatch { why, .. }) => why,
            other => panic!("expected a refusal, got {other:?}"),
        };
        let w = why(forge(&|r| {
            r.summary.per_seed[0].figures.insert("failed_fraction".into(), -5.0);
        }));
        assert!(w.contains("failed_fraction = -5"), "{w}");
        // An infinite figure cannot be written as JSON; one out of range is
        // refused as it is read.
        let mut one = serde_json::to_string(&sweep_run(shard(1), &[1, 3])).unwrap();
        one = one.replacen("\"latency_p50_s\":1.0", "\"latency_p50_s\":1e999", 1);
        assert!(one.contains("1e999"));
        let two = sweep_json(shard(2), &[2, 4]);
        assert!(matches!(
            merge(&[("a.json".into(), one), ("b.json".into(), two)]),
            Err(ShardError::NotAShard { .. })
        ));
        let w = why(forge(&|r| {
            r.summary.per_seed[0].invariants.pop();
        }));
        assert!(w.contains("not the registry's"), "{w}");
        let w = why(forge(&|r| {
            r.summary.per_seed[0].invariants[0].name = "invented".into();
        }));
        assert!(w.contains("not the registry's"), "{w}");
        let w = why(forge(&|r| r.summary.per_seed[0].seed = 2));
        assert!(w.contains("seed 2 is not one this shard runs"), "{w}");
        let w = why(forge(&|r| r.seed_range = [5, 1]));
        assert!(w.contains("not a range a command runs"), "{w}");
        let w = why(forge(&|r| r.scenario = "s.toml\u{1b}[2J".into()));
        assert!(w.contains("control character"), "{w}");
        let w = why(forge(&|r| r.summary.per_seed[0].error = Some("ok\nFORGED".into())));
        assert!(w.contains("control character"), "{w}");
        // A bidirectional control is no control character, but reorders
        // what the terminal shows.
        let w = why(forge(&|r| r.scenario = "s\u{202e}lmot.toml".into()));
        assert!(w.contains("bidirectional control"), "{w}");
        let w = why(forge(&|r| {
            r.summary.per_seed[0].error = Some("ok\u{2066}FORGED".into())
        }));
        assert!(w.contains("bidirectional control"), "{w}");
        let w = why(forge(&|r| r.shard = Some(Shard { index: 0, count: 2 })));
        assert!(w.contains("is not a shard"), "{w}");
        let w = why(forge(&|r| r.preamble = "   load gpu: forged\n".into()));
        assert!(w.contains("load lines differ"), "{w}");
        let w = why(forge(&|r| r.digest = "fedcba9876543210".into()));
        assert!(w.contains("was the scenario edited between shards?"), "{w}");
    }

    #[test]
    fn merging_refuses_a_missing_a_doubled_or_a_foreign_shard() {
        let one = (
            "a.json".to_owned(),
            sweep_json(Some(Shard { index: 1, count: 2 }), &[1, 3]),
        );
        let two = (
            "b.json".to_owned(),
            sweep_json(Some(Shard { index: 2, count: 2 }), &[2, 4]),
        );
        let merged = merge(&[two.clone(), one.clone()]).unwrap();
        let whole = sweep_run(None, &[1, 2, 3, 4]);
        assert_eq!(merged, Merged::Sweep(whole.clone()));
        // Byte for byte, episode figures (a third of a seed, an episode one
        // seed lacks) included.
        assert_eq!(merged.to_json(), serde_json::to_string_pretty(&whole).unwrap());
        assert_eq!(merged.render(), format!("{}{}", whole.preamble, whole.render()));
        assert_eq!(whole.summary.episodes[1].seeds, 3);
        assert!(merged.to_json().contains("\"latency_during_p99_s\""));
        assert_eq!(
            merge(std::slice::from_ref(&one)),
            Err(ShardError::Missing("2/2".into()))
        );
        assert!(matches!(
            merge(&[one.clone(), one.clone()]),
            Err(ShardError::Mismatch { why, .. }) if why.contains("given twice")
        ));
        let three = (
            "c.json".to_owned(),
            sweep_json(Some(Shard { index: 2, count: 3 }), &[2]),
        );
        assert!(matches!(
            merge(&[one.clone(), three]),
            Err(ShardError::Mismatch { why, .. }) if why.contains("shard of 3")
        ));
        assert!(matches!(
            merge(&[("x.json".into(), "{}".into())]),
            Err(ShardError::NotAShard { file, .. }) if file == "x.json"
        ));
        assert_eq!(merge(&[]), Err(ShardError::Nothing));
        // Many missing: a few named, the rest counted.
        let lone = (
            "d.json".to_owned(),
            sweep_json(Some(Shard { index: 1, count: 20 }), &[1]),
        );
        assert_eq!(
            merge(&[lone]),
            Err(ShardError::Missing(
                "2/20, 3/20, 4/20, 5/20, 6/20, 7/20, 8/20, 9/20, and 11 more".into()
            ))
        );
    }
}
