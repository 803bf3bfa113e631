//! `check`: every scenario under a directory run with its own seed, its
//! invariants checked.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use redstring_sim::campaign::simulate;
use redstring_sim::judgement::shell_word;
use redstring_sim::scenario::Scenario;
use redstring_sim::search::fuzz::BOUNDS_DIR;

use crate::shared::{BAD_SCENARIO, INVARIANT_FAILED, Outcome, SIM_FAILED, names};

/// Directories deeper than this under the one given are not walked.
pub const MAX_DEPTH: usize = 32;

/// The arguments of `check`.
#[derive(clap::Args)]
pub struct CheckArgs {
    /// The directory (default `scenarios`).
    #[arg(default_value = "scenarios")]
    dir: PathBuf,
    /// Count a scenario with any warning as bad (exit 2) and do not run it.
    #[arg(long)]
    strict: bool,
}

/// Every `*.toml` under `dir`, in subdirectories too (but not in fuzzer
/// bounds directories, nor deeper than [`MAX_DEPTH`]), sorted. A symlink to
/// a file is read; a symlink to a directory is not followed, so a link back
/// up the tree cannot make the walk endless.
fn scenario_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![(dir.to_path_buf(), 0usize)];
    while let Some((d, depth)) = pending.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let path = entry.path();
            let kind = entry.file_type()?;
            if kind.is_dir() {
                if depth < MAX_DEPTH && path.file_name().is_none_or(|n| n != BOUNDS_DIR) {
                    pending.push((path, depth + 1));
                }
            } else if path.extension().is_some_and(|x| x == "toml") && (kind.is_file() || path.is_file()) {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// Runs `check`.
pub fn check(args: CheckArgs) -> Outcome {
    let (dir, strict) = (args.dir.as_path(), args.strict);
    let files = scenario_files(dir).map_err(|e| {
        eprintln!("error: cannot read {}: {e}", dir.display());
        ExitCode::from(BAD_SCENARIO)
    })?;
    if files.is_empty() {
        eprintln!(
            "error: no scenario files (*.toml) in {} or its subdirectories",
            dir.display()
        );
        return Err(ExitCode::from(BAD_SCENARIO));
    }
    let mut worst = 0u8;
    for path in files {
        let scenario = match Scenario::load_checked(&path) {
            Ok((s, warnings)) => {
                let file = path.display().to_string();
                if strict && !warnings.is_empty() {
                    for w in warnings {
                        println!("BAD   {} (--strict)", w.into_error(&file));
                    }
                    worst = worst.max(BAD_SCENARIO);
                    continue;
                }
                for w in &warnings {
                    println!("WARN  {file}: {w}");
                }
                s
            }
            Err(e) => {
                println!("BAD   {e}");
                worst = worst.max(BAD_SCENARIO);
                continue;
            }
        };
        let started = Instant::now();
        match simulate(&scenario, scenario.seed) {
            Ok(run) if run.failed().is_empty() => {
                println!("ok    {} ({:.1} s)", path.display(), started.elapsed().as_secs_f64());
            }
            Ok(run) => {
                println!(
                    "FAIL  {}: {}\n      replay: redstring-sim run {} --seed {}",
                    path.display(),
                    names(&run.failed()),
                    shell_word(&path.display().to_string()),
                    run.seed
                );
                worst = worst.max(INVARIANT_FAILED);
            }
            Err(e) => {
                println!("ERROR {}: {e}", path.display());
                worst = worst.max(SIM_FAILED);
            }
        }
    }
    Ok(ExitCode::from(worst))
}
