//! What every command shares, written once: the exit codes, loading a
//! scenario, the seeds and parallelism flags, and writing outputs safely.
//!
//! A flag means the same in every command: `--seeds` is `N` (the `N` seeds
//! from `--seed`), `A..B` (`B` exclusive) or `A..=B` (`B` inclusive), never
//! more than [`MAX_SEEDS`]. An output (`--json`, `--trace`, `--svg`, `--out`)
//! is reserved before any work as a temporary file beside its target, and
//! renamed over the target only once every output of the command is complete;
//! an output that is one of the command's inputs (after symlinks), or that two
//! flags name, is refused before anything is opened for writing. A command
//! that fails therefore leaves every existing file as it was. An output that
//! is not a regular file (`/dev/null`, `/dev/stdout`, a FIFO) is written
//! straight into once the work is done, before any rename, never renamed
//! over: a device stays a device, and a write it refuses (`/dev/full`) fails
//! the command with every other output left as it was.

use std::fs::File;
use std::io::Write as _;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use redstring_sim::campaign::MAX_SEEDS;
use redstring_sim::judgement::shard;
use redstring_sim::scenario::{Scenario, Warning};

/// An invariant failed.
pub const INVARIANT_FAILED: u8 = 1;
/// A scenario, bounds or argument is unusable.
pub const BAD_SCENARIO: u8 = 2;
/// The simulation itself failed or ran over its work budget.
pub const SIM_FAILED: u8 = 3;
/// An output could not be written, or was refused.
pub const IO_FAILED: u8 = 4;
/// Every invariant held but an objective was missed.
pub const OBJECTIVE_MISSED: u8 = 5;

/// A command's early end: the exit code, its message already printed.
pub type Outcome = Result<ExitCode, ExitCode>;

/// Prints `e` as the error and gives exit code `code`.
pub fn fail(code: u8, e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(code)
}

/// The exit code of a finished command: a failed invariant wins over a
/// missed objective.
pub fn verdict(failed: bool, missed: bool) -> ExitCode {
    if failed {
        ExitCode::from(INVARIANT_FAILED)
    } else if missed {
        ExitCode::from(OBJECTIVE_MISSED)
    } else {
        ExitCode::SUCCESS
    }
}

/// Loads a scenario and prints every warning; under `strict` a warning is
/// an error.
pub fn load(path: &Path, strict: bool) -> Result<Scenario, ExitCode> {
    let loaded = Scenario::load_checked(path).map_err(|e| fail(BAD_SCENARIO, &e))?;
    warned(&path.display().to_string(), loaded, strict)
}

/// A scenario and its warnings, `shown` as `shown`: every warning printed,
/// or under `strict` each an error.
pub fn warned(shown: &str, (scenario, warnings): (Scenario, Vec<Warning>), strict: bool) -> Result<Scenario, ExitCode> {
    if strict && !warnings.is_empty() {
        for w in warnings {
            eprintln!("error: {} (--strict)", w.into_error(shown));
        }
        return Err(ExitCode::from(BAD_SCENARIO));
    }
    print_warnings(shown, &warnings);
    Ok(scenario)
}

/// Prints each warning about `file`.
fn print_warnings(file: &str, warnings: &[Warning]) {
    for w in warnings {
        eprintln!("warning: {file}: {w}");
    }
}

/// The files a run of `scenario`, loaded from `path`, reads: the scenario
/// and every tenant's replayed trace.
pub fn inputs_of(path: &Path, scenario: &Scenario) -> Vec<PathBuf> {
    let dir = path.parent().unwrap_or(Path::new(""));
    let mut out = vec![path.to_path_buf()];
    for w in &scenario.workers {
        out.extend(
            w.tenants
                .iter()
                .filter_map(|t| t.replay.as_ref())
                .map(|r| dir.join(&r.file)),
        );
    }
    out
}

/// Each server's offered load against its capacity, one line each.
pub fn loads(scenario: &Scenario) -> String {
    redstring_sim::scenario::sanity::loads(scenario)
        .iter()
        .map(|load| format!("   load {load}\n"))
        .collect()
}

/// `items` joined with commas.
pub fn names<T: std::fmt::Display>(items: &[T]) -> String {
    items.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

/// A progress bar of `len` steps named `what`, on stderr.
pub fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!("{{bar:40}} {{pos}}/{{len}} {what} {{msg}}"))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// The seeds of a command that runs many: one meaning everywhere.
#[derive(clap::Args, Clone, Debug)]
pub struct SeedArgs {
    /// Seeds: `N` (the N seeds from --seed), `A..B` (B exclusive) or
    /// `A..=B` (B inclusive); at most 100 000.
    #[arg(long)]
    pub seeds: Option<String>,
    /// The first seed when --seeds is a count (default 1).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SeedArgs {
    /// The seeds as a range, `count` seeds from `--seed` when no `--seeds`
    /// is given.
    pub fn range(&self, count: u64) -> Result<Range<u64>, ExitCode> {
        let text = self.seeds.clone().unwrap_or_else(|| count.to_string());
        parse_seeds(&text, self.seed).map_err(|e| fail(BAD_SCENARIO, &e))
    }
}

/// Parses `--seeds` (see [`SeedArgs`]); `first` is `--seed`, if given.
pub fn parse_seeds(text: &str, first: Option<u64>) -> Result<Range<u64>, String> {
    let bad =
        || format!("--seeds must be N (a count from --seed), A..B (B exclusive) or A..=B (B inclusive), got {text:?}");
    let number = |s: &str| s.trim().parse::<u64>().map_err(|_| bad());
    let range = if let Some((a, b)) = text.split_once("..=") {
        let (a, b) = (number(a)?, number(b)?);
        if a > b {
            return Err(format!("--seeds {text}: the range is empty ({a} is after {b})"));
        }
        a..b.checked_add(1)
            .ok_or_else(|| format!("--seeds {text}: the last seed is too large"))?
    } else if let Some((a, b)) = text.split_once("..") {
        let (a, b) = (number(a)?, number(b)?);
        if a >= b {
            return Err(format!(
                "--seeds {text}: the range is empty (B is exclusive, so B must be above A)"
            ));
        }
        a..b
    } else {
        let n = number(text)?;
        if n == 0 {
            return Err("--seeds 0: give at least one seed".into());
        }
        let from = first.unwrap_or(1);
        from..from
            .checked_add(n)
            .ok_or_else(|| format!("--seeds {text} from --seed {from}: the last seed is beyond 2^64"))?
    };
    if first.is_some() && text.contains("..") {
        return Err(format!(
            "--seed is the first seed of a count; with the range --seeds {text} leave --seed out"
        ));
    }
    let n = range.end - range.start;
    if n > MAX_SEEDS {
        return Err(format!(
            "--seeds {text} is {n} seeds, above the most one command runs ({MAX_SEEDS}); split them over processes with --shard i/n and join them with `merge`"
        ));
    }
    Ok(range)
}

/// Address space a process takes before any run: the binary, its
/// libraries, the allocator's first arena.
const BASE_ADDRESS_SPACE: u64 = 256 << 20;

/// Address space each simulation running at once adds besides its data:
/// its thread's stack and the allocator's arena for it (glibc reserves
/// 64 MB an arena). Kept small, so that a machine of many cores is not
/// refused for its cores alone.
const ADDRESS_SPACE_PER_JOB: u64 = 64 << 20;

/// Refuses (exit 3), before any run, `jobs` runs at once of the largest of
/// `scenarios` when their estimated memory ([`Work::memory_estimate`])
/// exceeds the process's address-space limit (`ulimit -v`, `prlimit
/// --as`): such a run would end in an allocation failure and an abort
/// after minutes, not an error. Without a limit nothing is refused.
///
/// [`Work::memory_estimate`]: redstring_sim::world::Work::memory_estimate
pub fn fits_memory<'s>(scenarios: impl IntoIterator<Item = &'s Scenario>, jobs: usize) -> Result<(), ExitCode> {
    let Some(limit) = address_space_limit() else {
        return Ok(());
    };
    fits_within(scenarios, jobs, limit).map_err(|e| fail(SIM_FAILED, &e))
}

/// [`fits_memory`] against `limit` bytes; the refusal says why.
fn fits_within<'s>(scenarios: impl IntoIterator<Item = &'s Scenario>, jobs: usize, limit: u64) -> Result<(), String> {
    let Some(work) = scenarios
        .into_iter()
        .map(redstring_sim::world::Work::of)
        .max_by_key(|w| w.memory_estimate())
    else {
        return Ok(());
    };
    let jobs = jobs.max(1) as u64;
    let each = work.memory_estimate();
    let need = each
        .saturating_add(ADDRESS_SPACE_PER_JOB)
        .saturating_mul(jobs)
        .saturating_add(BASE_ADDRESS_SPACE);
    if need <= limit {
        return Ok(());
    }
    let gb = |b: u64| b as f64 / f64::from(1u32 << 30);
    let at_once = if jobs > 1 {
        format!(", {jobs} at once (--jobs)")
    } else {
        String::new()
    };
    Err(format!(
        "a run of this scenario needs about {:.1} GB of memory ({} calls × about {} KB){at_once}, {:.1} GB in all, above this process's address-space limit of {:.1} GB; run fewer calls (a shorter duration_s, lower rates, a replay window with fewer requests){}, or raise the limit",
        gb(each),
        work.calls,
        redstring_sim::world::BYTES_PER_CALL / 1024,
        gb(need),
        gb(limit),
        if jobs > 1 { ", pass a smaller --jobs" } else { "" },
    ))
}

/// The soft address-space limit of this process, if it has one.
fn address_space_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max address space"))?;
    line.trim_start_matches("Max address space")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// How a command that runs many simulations spreads them.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct Parallel {
    /// Simulations run at once (default: every core); the results do not
    /// depend on it.
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Run only shard `i` of `n` of the simulations (every `n`th from the
    /// `i`th); `merge` joins the shards' `--json`.
    #[arg(long, value_parser = parse_shard)]
    pub shard: Option<shard::Shard>,
}

/// `--jobs`, or every core.
pub fn jobs_or_cores(jobs: Option<usize>) -> usize {
    jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1)
}

/// Parses `--shard i/n`.
pub fn parse_shard(text: &str) -> Result<shard::Shard, String> {
    shard::Shard::parse(text).map_err(|e| e.to_string())
}

/// One reserved output: where it goes, and what holds it until the command
/// commits.
struct Slot {
    flag: &'static str,
    shown: PathBuf,
    target: PathBuf,
    held: Held,
    written: bool,
}

/// Where an output waits for the command to commit.
enum Held {
    /// A temporary file beside a regular (or new) file, renamed over it.
    Temp(tempfile::NamedTempFile),
    /// The text for a device or FIFO, written into it: renaming over
    /// `/dev/null` would replace the device with a file.
    Direct(Vec<u8>),
}

/// A command's output files, reserved before any work and renamed over
/// their targets only by [`Outputs::commit`].
pub struct Outputs {
    slots: Vec<Slot>,
}

/// The file `path` names, symlinks resolved; for a file not yet there, its
/// resolved directory joined with its name.
fn identity(path: &Path) -> std::io::Result<PathBuf> {
    if let Ok(p) = path.canonicalize() {
        return Ok(p);
    }
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Ok(dir.canonicalize()?.join(name))
}

/// Whether `a` and `b` are one file (the same path once resolved, or, on
/// Unix, the same device and inode: a hard link).
fn same_file(a: &Path, b: &Path) -> bool {
    if a == b {
        return true;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return x.dev() == y.dev() && x.ino() == y.ino();
        }
    }
    false
}

fn io_failed(path: &Path, e: &dyn std::fmt::Display) -> ExitCode {
    fail(IO_FAILED, &format!("cannot write {}: {e}", path.display()))
}

impl Outputs {
    /// Reserves each `(flag, path)` given: a temporary file in the target's
    /// directory (so an unwritable place fails now, before any simulation).
    /// Two flags naming one file are refused.
    pub fn reserve(wanted: impl IntoIterator<Item = (&'static str, Option<PathBuf>)>) -> Result<Outputs, ExitCode> {
        let mut slots: Vec<Slot> = Vec::new();
        for (flag, path) in wanted {
            let Some(shown) = path else { continue };
            let target = identity(&shown).map_err(|e| io_failed(&shown, &e))?;
            if let Some(other) = slots.iter().find(|s| same_file(&s.target, &target)) {
                return Err(fail(
                    IO_FAILED,
                    &format!(
                        "{flag} {} and {} {} name one file: give each output its own path",
                        shown.display(),
                        other.flag,
                        other.shown.display()
                    ),
                ));
            }
            if target.is_dir() {
                return Err(io_failed(&shown, &"it is a directory"));
            }
            // Followed through symlinks (`/dev/stdout`): what a write lands in.
            if std::fs::metadata(&shown).is_ok_and(|m| !m.is_file()) {
                slots.push(Slot {
                    flag,
                    shown,
                    target,
                    held: Held::Direct(Vec::new()),
                    written: false,
                });
                continue;
            }
            let dir = target.parent().unwrap_or(Path::new("."));
            let name = target
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            let prefix = format!(".{name}.");
            let mut builder = tempfile::Builder::new();
            builder.prefix(&prefix).suffix(".part");
            // Created as a shell creates a file: 0666 less the umask.
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt as _;
                builder.permissions(std::fs::Permissions::from_mode(0o666));
            }
            let temp = builder.tempfile_in(dir).map_err(|e| io_failed(&shown, &e))?;
            slots.push(Slot {
                flag,
                shown,
                target,
                held: Held::Temp(temp),
                written: false,
            });
        }
        Ok(Outputs { slots })
    }

    /// Refuses (exit 4) an output that is one of `inputs`, after symlinks:
    /// writing it would destroy what the command reads.
    pub fn refuse_inputs(&self, inputs: &[PathBuf]) -> Result<(), ExitCode> {
        for input in inputs {
            let Ok(resolved) = input.canonicalize() else { continue };
            if let Some(s) = self.slots.iter().find(|s| same_file(&s.target, &resolved)) {
                return Err(fail(
                    IO_FAILED,
                    &format!(
                        "{} {} is {}, an input of this command: writing it would destroy it; choose another path",
                        s.flag,
                        s.shown.display(),
                        input.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether `flag` was given.
    pub fn has(&self, flag: &str) -> bool {
        self.slots.iter().any(|s| s.flag == flag)
    }

    /// Writes the output of `flag`, if given, into its temporary file; a
    /// flag reserved for several paths (`lab --trace`, one a repetition)
    /// writes the next of them not yet written.
    pub fn write(&mut self, flag: &str, contents: impl FnOnce() -> String) -> Result<(), ExitCode> {
        let Some(slot) = self.slots.iter_mut().find(|s| s.flag == flag && !s.written) else {
            return Ok(());
        };
        match &mut slot.held {
            Held::Temp(temp) => {
                let file: &mut File = temp.as_file_mut();
                file.write_all(contents().as_bytes())
                    .and_then(|()| file.sync_all())
                    .map_err(|e| io_failed(&slot.shown, &e))?;
            }
            Held::Direct(text) => *text = contents().into_bytes(),
        }
        slot.written = true;
        Ok(())
    }

    /// Writes every written output that is a device or FIFO, then renames
    /// every other over its target. Called once the command's work is done;
    /// an output never written is left as it was. Every step that can fail
    /// but the renames themselves is taken for every output before the
    /// first rename.
    pub fn commit(self) -> Result<(), ExitCode> {
        let mut ready = Vec::new();
        for slot in self.slots.into_iter().filter(|s| s.written) {
            let temp = match slot.held {
                Held::Direct(text) => {
                    // Opened to write, never created or truncated: it exists
                    // and is no regular file.
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(&slot.shown)
                        .and_then(|mut f| f.write_all(&text).and_then(|()| f.flush()))
                        .map_err(|e| io_failed(&slot.shown, &e))?;
                    continue;
                }
                Held::Temp(temp) => temp.into_temp_path(),
            };
            // A file written over keeps its permissions.
            if let Ok(m) = std::fs::metadata(&slot.target) {
                std::fs::set_permissions(&temp, m.permissions()).map_err(|e| io_failed(&slot.shown, &e))?;
            }
            ready.push((temp, slot.target, slot.shown));
        }
        for (temp, target, shown) in ready {
            temp.persist(&target).map_err(|e| io_failed(&shown, &e.error))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_reserved_for_several_paths_writes_each_in_turn() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("t-1.jsonl"), dir.path().join("t-2.jsonl"));
        let mut outputs = Outputs::reserve([("--trace", Some(a.clone())), ("--trace", Some(b.clone()))]).unwrap();
        outputs.write("--trace", || "first".into()).unwrap();
        outputs.write("--trace", || "second".into()).unwrap();
        outputs.commit().unwrap();
        assert_eq!(std::fs::read_to_string(a).unwrap(), "first");
        assert_eq!(std::fs::read_to_string(b).unwrap(), "second");
    }

    #[test]
    fn seeds_mean_a_count_from_the_first_or_a_range_either_way() {
        assert_eq!(parse_seeds("20", None), Ok(1..21));
        assert_eq!(parse_seeds("3", Some(10)), Ok(10..13));
        assert_eq!(parse_seeds("1..21", None), Ok(1..21));
        assert_eq!(parse_seeds("1..=20", None), Ok(1..21));
        assert_eq!(parse_seeds("5..=5", None), Ok(5..6));
    }

    #[test]
    fn seeds_beyond_the_bound_or_empty_or_mixed_are_refused_naming_the_fix() {
        let huge = parse_seeds("0..18446744073709551615", None).unwrap_err();
        assert!(
            huge.contains("above the most one command runs (100000)") && huge.contains("--shard"),
            "{huge}"
        );
        assert!(
            parse_seeds("18446744073709551615", None)
                .unwrap_err()
                .contains("beyond 2^64")
        );
        assert!(
            parse_seeds("1..=18446744073709551615", None)
                .unwrap_err()
                .contains("too large")
        );
        assert!(parse_seeds("5..5", None).unwrap_err().contains("empty"));
        assert!(parse_seeds("6..=5", None).unwrap_err().contains("empty"));
        assert!(parse_seeds("0", None).unwrap_err().contains("at least one"));
        assert!(parse_seeds("1..5", Some(3)).unwrap_err().contains("leave --seed out"));
        assert!(parse_seeds("a..b", None).unwrap_err().contains("must be N"));
        assert_eq!(parse_seeds("100000", None).map(|r| r.end - r.start), Ok(MAX_SEEDS));
        assert!(parse_seeds("100001", None).is_err());
    }

    #[test]
    fn a_run_past_the_address_space_limit_is_refused_with_its_figures() {
        let text = "name = \"x\"\nduration_s = 60\n[[servers]]\nname = \"gpu\"\n[[workers]]\nname = \"w\"\nservers = [\"gpu\"]\ntenants = [{ id = 1, calls_per_min = 60000 }]\n";
        let scenario = Scenario::parse("x.toml", text).unwrap();
        // 60 000 calls, about 352 MB.
        assert_eq!(fits_within([&scenario], 1, 1 << 30), Ok(()));
        let why = fits_within([&scenario], 1, 512 << 20).unwrap_err();
        assert!(
            why.contains("60000 calls × about 6 KB") && why.contains("limit of 0.5 GB"),
            "{why}"
        );
        assert!(!why.contains("--jobs"), "{why}");
        let why = fits_within([&scenario], 4, 1 << 30).unwrap_err();
        assert!(
            why.contains("4 at once (--jobs)") && why.contains("a smaller --jobs"),
            "{why}"
        );
        assert_eq!(fits_within(std::iter::empty(), 4, 0), Ok(()));
    }

    mod parsers {
        //! `--seeds`, `--set` and `--vary` take any text a user types: each
        //! parser returns a bounded result or an error, and never panics.

        use proptest::prelude::*;
        use redstring_sim::judgement::compare::{MAX_KEY_DEPTH, parse_set, set_field};
        use redstring_sim::search::tune::{Dim, MAX_LEVELS};

        use super::*;

        /// Text made of the pieces these flags are written with, so that
        /// near-misses (`1..`, `..=5`, `a.b=1,,2`, `0..1:1e-300`) come up
        /// often, and any text at all besides.
        fn flag_text() -> impl Strategy<Value = String> {
            let piece = prop_oneof![
                Just("..".to_owned()),
                Just("..=".to_owned()),
                Just("=".to_owned()),
                Just(",".to_owned()),
                Just(":".to_owned()),
                Just(".".to_owned()),
                Just("-".to_owned()),
                Just(" ".to_owned()),
                Just("0".to_owned()),
                Just("1".to_owned()),
                Just("100000".to_owned()),
                Just("100001".to_owned()),
                Just("18446744073709551615".to_owned()),
                Just("18446744073709551616".to_owned()),
                Just("9223372036854775807".to_owned()),
                Just("-9223372036854775808".to_owned()),
                Just("1e308".to_owned()),
                Just("-1e308".to_owned()),
                Just("1e-320".to_owned()),
                Just("nan".to_owned()),
                Just("inf".to_owned()),
                Just("0.1".to_owned()),
                Just("hardening".to_owned()),
                Just("servers".to_owned()),
                Just("rpm".to_owned()),
                Just("\"x\"".to_owned()),
                Just("[".to_owned()),
                Just("{".to_owned()),
                Just("\u{202e}".to_owned()),
                "\\PC{0,8}",
            ];
            prop_oneof![
                prop::collection::vec(piece, 0..10).prop_map(|p| p.concat()),
                any::<String>(),
            ]
        }

        const SCENARIO: &str = "name = \"x\"\nduration_s = 10\n[hardening]\nrpm = 60\n[[servers]]\nname = \"gpu\"\n";

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

            #[test]
            fn seeds_are_a_bounded_range_or_an_error(text in flag_text(), first in prop::option::of(any::<u64>())) {
                if let Ok(r) = parse_seeds(&text, first) {
                    prop_assert!(r.start < r.end, "{text:?}: {r:?}");
                    prop_assert!(r.end - r.start <= MAX_SEEDS, "{text:?}: {r:?}");
                }
            }

            #[test]
            fn a_set_is_a_key_and_values_or_an_error(text in flag_text()) {
                if let Ok((key, values)) = parse_set(&text) {
                    prop_assert!(!key.is_empty() && !values.is_empty());
                    prop_assert!(values.len() <= text.len());
                    for v in &values {
                        // Whatever the key and value, setting it in a
                        // scenario's text is a text or an error.
                        if let Ok(out) = set_field(SCENARIO, &key, v) {
                            prop_assert!(key.split('.').count() <= MAX_KEY_DEPTH);
                            prop_assert!(out.parse::<toml::Table>().is_ok(), "{key}={v}: {out}");
                        }
                    }
                }
            }

            #[test]
            fn a_vary_is_a_bounded_dimension_or_an_error(text in flag_text()) {
                if let Ok(dim) = Dim::parse(&text) {
                    prop_assert!(!dim.key.is_empty());
                    if let Some(levels) = dim.levels() {
                        prop_assert!((1..=MAX_LEVELS.max(text.len() as u64)).contains(&levels), "{text:?}: {levels}");
                    }
                }
            }
        }
    }
}
