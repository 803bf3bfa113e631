//! Replaying an arrival trace: a tenant's calls at the instants, and with the
//! token counts, a recorded workload had — a day of a user's own traffic, or
//! a public trace — instead of a synthetic Poisson stream.
//!
//! Two published layouts are read (their columns are documented by the
//! traces' own READMEs; see `docs/server-kinds.md`'s sources):
//!
//! - **BurstGPT** CSV: a header row naming `Timestamp` (seconds from the
//!   trace's start), `Request tokens` and `Response tokens` among its
//!   columns (the 6-column `BurstGPT_1`/`_2` and the 8-column `BurstGPT_3`
//!   layouts both have them). Rows with `Response tokens = 0` are requests
//!   that failed when recorded, and are skipped.
//! - **Mooncake** JSONL: one object per line with `timestamp`
//!   (milliseconds), `input_length` and `output_length` (tokens); other
//!   fields (`hash_ids`) are ignored.
//!
//! The trace's clock is shifted by `start_s` and divided by `speedup`; only
//! requests that fall inside the run are kept, at most [`MAX_REQUESTS`] over
//! all of a scenario's replays, so files of any size, replayed by any number
//! of tenants, cost bounded memory. A malformed row is an error naming
//! its line.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The most requests one tenant's replay may keep (inside the run).
pub const MAX_REQUESTS: usize = 1_000_000;

/// The most bytes one line of a trace may have.
const MAX_LINE: u64 = 64 * 1024;

/// A tenant's replay of an arrival trace, as the scenario file writes it:
/// `replay = { file = "traces/day.csv" }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replay {
    /// The trace file, relative to the scenario file.
    pub file: String,
    /// Its layout; by default from the extension (`.csv`: BurstGPT,
    /// `.jsonl`: Mooncake).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<TraceFormat>,
    /// Seconds into the trace at which the run starts.
    #[serde(default)]
    pub start_s: f64,
    /// How many times faster than recorded to replay it.
    #[serde(default = "one")]
    pub speedup: f64,
    /// The requests inside the run, read when the scenario is loaded.
    #[serde(skip)]
    pub requests: Arc<[TraceRequest]>,
}

fn one() -> f64 {
    1.0
}

/// A trace file's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceFormat {
    /// BurstGPT's CSV.
    Burstgpt,
    /// Mooncake's JSONL.
    Mooncake,
}

/// One recorded request, as the run replays it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceRequest {
    /// When it arrives, from the start of the run.
    pub at: Duration,
    /// Its prompt tokens.
    pub prompt_tokens: u64,
    /// The tokens its answer had.
    pub output_tokens: u64,
}

/// Why a trace could not be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The file could not be read.
    #[error("cannot read {file}: {source}")]
    Io {
        /// The file.
        file: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A row, or the file's layout, is not what the format says.
    #[error("{file}: line {line}: {message}")]
    Malformed {
        /// The file.
        file: String,
        /// The line (1-based).
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// Settings that cannot describe a replay.
    #[error("{0}")]
    Settings(String),
}

impl Replay {
    /// The layout to read: the one named, or the extension's.
    pub fn format(&self) -> Result<TraceFormat, ReplayError> {
        if let Some(f) = self.format {
            return Ok(f);
        }
        match Path::new(&self.file).extension().and_then(|e| e.to_str()) {
            Some("csv") => Ok(TraceFormat::Burstgpt),
            Some("jsonl") => Ok(TraceFormat::Mooncake),
            _ => Err(ReplayError::Settings(format!(
                "cannot tell the layout of {:?} from its extension; set format = \"burstgpt\" or \"mooncake\"",
                self.file
            ))),
        }
    }

    /// Reads the trace at `path` into `self.requests`: the requests that
    /// arrive within `duration` of the run's start, at most [`MAX_REQUESTS`].
    pub fn load(&mut self, path: &Path, duration: Duration) -> Result<(), ReplayError> {
        self.load_at_most(path, duration, MAX_REQUESTS)
    }

    /// [`Replay::load`], keeping at most `most` requests: what is left of
    /// [`MAX_REQUESTS`] after the scenario's other replays, so that many
    /// tenants replaying large traces cost no more memory than one.
    pub fn load_at_most(&mut self, path: &Path, duration: Duration, most: usize) -> Result<(), ReplayError> {
        if !(self.start_s.is_finite() && self.start_s >= 0.0) {
            return Err(ReplayError::Settings(format!(
                "start_s must not be negative, got {}",
                self.start_s
            )));
        }
        if !(self.speedup.is_finite() && (0.001..=1_000_000.0).contains(&self.speedup)) {
            return Err(ReplayError::Settings(format!(
                "speedup must be between 0.001 and 1000000, got {}",
                self.speedup
            )));
        }
        let format = self.format()?;
        let file = path.display().to_string();
        let reader = crate::scenario::input::open(path).map_err(|source| ReplayError::Io {
            file: file.clone(),
            source,
        })?;
        let window = Window {
            start_s: self.start_s,
            speedup: self.speedup,
            duration,
            most: most.min(MAX_REQUESTS),
        };
        let requests = read(BufReader::new(reader), format, window, &file)?;
        self.requests = requests.into();
        Ok(())
    }
}

/// Which part of the trace the run covers, and how fast.
#[derive(Clone, Copy, Debug)]
struct Window {
    start_s: f64,
    speedup: f64,
    duration: Duration,
    /// The most requests kept (at most [`MAX_REQUESTS`]).
    most: usize,
}

impl Window {
    /// The run instant of a request recorded `t_s` seconds into the trace, if
    /// it falls inside the run.
    fn place(&self, t_s: f64) -> Option<Duration> {
        let at = (t_s - self.start_s) / self.speedup;
        if !(at.is_finite() && at >= 0.0) {
            return None;
        }
        Duration::try_from_secs_f64(at).ok().filter(|at| *at < self.duration)
    }
}

/// Reads `input` in `format`, keeping the requests inside `window`, sorted.
fn read(
    input: impl BufRead,
    format: TraceFormat,
    window: Window,
    file: &str,
) -> Result<Vec<TraceRequest>, ReplayError> {
    let bad = |line: usize, message: String| ReplayError::Malformed {
        file: file.to_owned(),
        line,
        message,
    };
    let mut out = Vec::new();
    let mut columns: Option<[usize; 3]> = None;
    let mut lines = input;
    let mut buf = Vec::new();
    let mut n = 0;
    loop {
        buf.clear();
        let read = (&mut lines)
            .take(MAX_LINE + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|source| ReplayError::Io {
                file: file.to_owned(),
                source,
            })?;
        if read == 0 {
            break;
        }
        n += 1;
        if read as u64 > MAX_LINE {
            return Err(bad(n, format!("longer than {MAX_LINE} bytes")));
        }
        let line = std::str::from_utf8(&buf).map_err(|e| {
            bad(
                n,
                format!(
                    "not UTF-8 text (an invalid byte at column {}); save the trace as UTF-8",
                    e.valid_up_to() + 1
                ),
            )
        })?;
        // A UTF-8 byte-order mark starts the file, not its first row.
        let line = if n == 1 {
            line.trim_start_matches('\u{feff}')
        } else {
            line
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let (t_s, prompt, output) = match format {
            TraceFormat::Burstgpt => {
                let fields = csv_fields(line).map_err(|m| bad(n, m))?;
                let fields: Vec<&str> = fields.iter().map(|f| f.trim()).collect();
                let Some([t, p, o]) = columns else {
                    columns = Some(burstgpt_columns(&fields).map_err(|m| bad(n, m))?);
                    continue;
                };
                let get = |i: usize, name: &str| -> Result<&str, ReplayError> {
                    fields
                        .get(i)
                        .copied()
                        .ok_or_else(|| bad(n, format!("no {name} column ({} fields)", fields.len())))
                };
                let t_s: f64 = parse(get(t, "Timestamp")?, "Timestamp").map_err(|m| bad(n, m))?;
                let prompt: u64 = parse(get(p, "Request tokens")?, "Request tokens").map_err(|m| bad(n, m))?;
                let output: u64 = parse(get(o, "Response tokens")?, "Response tokens").map_err(|m| bad(n, m))?;
                if output == 0 {
                    // A request that failed when it was recorded.
                    continue;
                }
                (t_s, prompt, output)
            }
            TraceFormat::Mooncake => {
                if !line.starts_with('{') {
                    return Err(bad(
                        n,
                        "not a Mooncake row: each line must be a JSON object with timestamp, input_length and output_length".into(),
                    ));
                }
                let row: MooncakeRow =
                    serde_json::from_str(line).map_err(|e| bad(n, format!("not a Mooncake row: {e}")))?;
                (row.timestamp / 1000.0, row.input_length, row.output_length)
            }
        };
        if !(t_s.is_finite() && t_s >= 0.0) {
            return Err(bad(n, format!("the timestamp must not be negative, got {t_s}")));
        }
        if prompt > super::limits::MAX_TRACE_TOKENS || output > super::limits::MAX_TRACE_TOKENS {
            return Err(bad(
                n,
                format!(
                    "at most {} tokens either way, got {prompt} and {output}",
                    super::limits::MAX_TRACE_TOKENS
                ),
            ));
        }
        if let Some(at) = window.place(t_s) {
            if out.len() == window.most {
                let why = if window.most < MAX_REQUESTS {
                    format!(
                        "with the replays before it, more than {MAX_REQUESTS} replayed requests fall inside the run, the most one run holds; shorten it, raise start_s or replay fewer tenants"
                    )
                } else {
                    format!("more than {MAX_REQUESTS} requests fall inside the run; shorten it or raise start_s")
                };
                return Err(bad(n, why));
            }
            out.push(TraceRequest {
                at,
                prompt_tokens: prompt,
                output_tokens: output,
            });
        }
    }
    if format == TraceFormat::Burstgpt && columns.is_none() {
        return Err(bad(1, "no header row (BurstGPT's CSV starts with one)".into()));
    }
    out.sort_by_key(|r| r.at);
    Ok(out)
}

/// A Mooncake row's fields the replay reads.
#[derive(Deserialize)]
struct MooncakeRow {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
}

/// The indexes of BurstGPT's `Timestamp`, `Request tokens` and `Response
/// tokens` columns in its header row.
/// A UTF-8 byte-order mark before the first column is not part of its name.
/// The header is not echoed in an error: a file that is not a trace (a
/// password file named by mistake) must not be printed.
fn burstgpt_columns(header: &[&str]) -> Result<[usize; 3], String> {
    let find = |name: &str| {
        header
            .iter()
            .position(|h| h.trim_start_matches('\u{feff}').eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                format!(
                    "the first line has no {name:?} column ({} comma-separated fields); BurstGPT's CSV starts with a header naming Timestamp, Request tokens and Response tokens",
                    header.len()
                )
            })
    };
    Ok([find("Timestamp")?, find("Request tokens")?, find("Response tokens")?])
}

/// The fields of one CSV line as RFC 4180 writes them: separated by commas,
/// a field in double quotes may hold commas, and `""` inside it is one
/// quote. A quoted field must close on its own line — a field spanning
/// lines is refused rather than misread as two rows — and only spaces may
/// follow its closing quote. A quote inside an unquoted field is kept as
/// written.
fn csv_fields(line: &str) -> Result<Vec<std::borrow::Cow<'_, str>>, String> {
    use std::borrow::Cow;
    let mut out = Vec::new();
    let mut rest = line;
    loop {
        let field = rest.trim_start_matches([' ', '\t']);
        if let Some(quoted) = field.strip_prefix('"') {
            let mut text = String::new();
            let mut chars = quoted.char_indices();
            let after = loop {
                match chars.next() {
                    None => {
                        return Err(format!(
                            "field {} opens a quote that does not close on this line (a field spanning lines is not read)",
                            out.len() + 1
                        ));
                    }
                    Some((i, '"')) => {
                        if quoted[i + 1..].starts_with('"') {
                            text.push('"');
                            chars.next();
                        } else {
                            break &quoted[i + 1..];
                        }
                    }
                    Some((_, c)) => text.push(c),
                }
            };
            out.push(Cow::Owned(text));
            let after = after.trim_start_matches([' ', '\t']);
            match after.strip_prefix(',') {
                Some(next) => rest = next,
                None if after.is_empty() => return Ok(out),
                None => {
                    return Err(format!(
                        "field {} has text after its closing quote (a quote inside a quoted field is written \"\")",
                        out.len()
                    ));
                }
            }
        } else {
            match rest.split_once(',') {
                Some((field, next)) => {
                    out.push(Cow::Borrowed(field));
                    rest = next;
                }
                None => {
                    out.push(Cow::Borrowed(rest));
                    return Ok(out);
                }
            }
        }
    }
}

/// Parses one field; an error quotes at most its first 32 characters,
/// escaped, so a stray file's contents are neither printed at length nor
/// able to drive the terminal.
fn parse<T: std::str::FromStr>(text: &str, name: &str) -> Result<T, String> {
    text.parse().map_err(|_| {
        let shown: String = text.chars().take(32).collect();
        let more = if text.chars().count() > 32 { "…" } else { "" };
        format!("{name} is not a number of the right kind: {shown:?}{more}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(start_s: f64, speedup: f64, duration_s: u64) -> Window {
        Window {
            start_s,
            speedup,
            duration: Duration::from_secs(duration_s),
            most: MAX_REQUESTS,
        }
    }

    fn secs(r: &TraceRequest) -> f64 {
        r.at.as_secs_f64()
    }

    #[test]
    fn burstgpt_rows_are_placed_by_their_timestamp_and_failed_ones_skipped() {
        let csv = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n\
                   5,ChatGPT,472,18,490,Conversation log\n\
                   45,ChatGPT,1087,230,1317,Conversation log\n\
                   50,GPT-4,100,0,100,API log\n\
                   700,ChatGPT,10,10,20,API log\n";
        let got = read(csv.as_bytes(), TraceFormat::Burstgpt, window(0.0, 1.0, 600), "t.csv").unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(
            (secs(&got[0]), got[0].prompt_tokens, got[0].output_tokens),
            (5.0, 472, 18)
        );
        assert_eq!(
            (secs(&got[1]), got[1].prompt_tokens, got[1].output_tokens),
            (45.0, 1087, 230)
        );
        // Started 10 s in and twice as fast: 5 s is before the run, 45 s is
        // at (45 − 10) / 2.
        let got = read(csv.as_bytes(), TraceFormat::Burstgpt, window(10.0, 2.0, 600), "t.csv").unwrap();
        assert_eq!(got.iter().map(secs).collect::<Vec<_>>(), [17.5, 345.0]);
    }

    #[test]
    fn a_byte_order_mark_before_the_header_is_not_part_of_its_first_column() {
        let csv = "\u{feff}Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n4,ChatGPT,20,30,50,Conversation log\n";
        let got = read(csv.as_bytes(), TraceFormat::Burstgpt, window(0.0, 1.0, 60), "t.csv").unwrap();
        assert_eq!((got.len(), got[0].prompt_tokens), (1, 20));
    }

    #[test]
    fn the_eight_column_layout_is_read_by_its_header() {
        let csv = "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n\
                   3,abc,1.5,ChatGPT,20,30,50,Conversation log\n";
        let got = read(csv.as_bytes(), TraceFormat::Burstgpt, window(0.0, 1.0, 60), "t.csv").unwrap();
        assert_eq!((got[0].prompt_tokens, got[0].output_tokens), (20, 30));
    }

    #[test]
    fn mooncake_timestamps_are_milliseconds() {
        let jsonl = "{\"timestamp\": 0, \"input_length\": 6758, \"output_length\": 500, \"hash_ids\": [0, 1]}\n\
                     {\"timestamp\": 3000, \"input_length\": 10, \"output_length\": 2}\n";
        let got = read(jsonl.as_bytes(), TraceFormat::Mooncake, window(0.0, 1.0, 60), "t.jsonl").unwrap();
        assert_eq!(got.iter().map(secs).collect::<Vec<_>>(), [0.0, 3.0]);
        assert_eq!((got[0].prompt_tokens, got[0].output_tokens), (6758, 500));
    }

    #[test]
    fn malformed_rows_name_their_line() {
        let e = read(
            "Timestamp,Request tokens,Response tokens\n1,2,3\nx,2,3\n".as_bytes(),
            TraceFormat::Burstgpt,
            window(0.0, 1.0, 60),
            "t.csv",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("t.csv: line 3") && e.contains("Timestamp"), "{e}");
        let e = read(
            "Time,Request tokens\n".as_bytes(),
            TraceFormat::Burstgpt,
            window(0.0, 1.0, 60),
            "t.csv",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 1") && e.contains("\"Timestamp\""), "{e}");
        let e = read(
            "{\"timestamp\": -5, \"input_length\": 1, \"output_length\": 1}\n".as_bytes(),
            TraceFormat::Mooncake,
            window(0.0, 1.0, 60),
            "t.jsonl",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 1") && e.contains("negative"), "{e}");
        let e = read(
            "{\"timestamp\": 1, \"input_length\": 99999999999, \"output_length\": 1}\n".as_bytes(),
            TraceFormat::Mooncake,
            window(0.0, 1.0, 60),
            "t.jsonl",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("tokens"), "{e}");
        let long = format!("Timestamp,Request tokens,Response tokens\n{}\n", "1".repeat(70_000));
        let e = read(long.as_bytes(), TraceFormat::Burstgpt, window(0.0, 1.0, 60), "t.csv")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && e.contains("longer than"), "{e}");
    }

    #[test]
    fn quoted_csv_fields_are_read_as_rfc_4180_writes_them() {
        let csv = "\"Timestamp\",Model,Request tokens,Response tokens,Total tokens,Log Type\n\
                   5,\"Chat, GPT\",20,30,50,\"a \"\"quoted\"\" log\"\n\
                   6, \"ChatGPT\" ,\"21\",31,52,API log\n";
        let got = read(csv.as_bytes(), TraceFormat::Burstgpt, window(0.0, 1.0, 60), "t.csv").unwrap();
        assert_eq!(
            got.iter()
                .map(|r| (r.prompt_tokens, r.output_tokens))
                .collect::<Vec<_>>(),
            [(20, 30), (21, 31)]
        );
        assert_eq!(csv_fields("a,\"b,c\",\"d\"\"e\",").unwrap(), ["a", "b,c", "d\"e", ""]);
    }

    #[test]
    fn a_quoted_field_spanning_lines_is_refused_with_its_line() {
        let csv = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n\
                   5,ChatGPT,20,30,50,\"a log\nthat goes on\"\n";
        let e = read(csv.as_bytes(), TraceFormat::Burstgpt, window(0.0, 1.0, 60), "t.csv")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("t.csv: line 2") && e.contains("field 6") && e.contains("spanning lines"),
            "{e}"
        );
        let e = read(
            "Timestamp,Request tokens,Response tokens\n1,\"2\"x,3\n".as_bytes(),
            TraceFormat::Burstgpt,
            window(0.0, 1.0, 60),
            "t.csv",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 2") && e.contains("field 2"), "{e}");
    }

    #[test]
    fn invalid_utf8_is_refused_with_its_line() {
        let mut csv = b"Timestamp,Request tokens,Response tokens\n1,2,3\n4,5,".to_vec();
        csv.extend_from_slice(&[0xff, 0xfe, b'\n']);
        let e = read(&csv[..], TraceFormat::Burstgpt, window(0.0, 1.0, 60), "t.csv")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("t.csv: line 3") && e.contains("UTF-8") && e.contains("column 5"),
            "{e}"
        );
        let jsonl = b"{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"x\": \"\xc3\"}\n";
        let e = read(&jsonl[..], TraceFormat::Mooncake, window(0.0, 1.0, 60), "t.jsonl")
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.jsonl: line 1") && e.contains("UTF-8"), "{e}");
    }

    #[test]
    fn a_mooncake_row_that_is_an_array_is_refused() {
        let e = read(
            "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n[1000, 10, 2]\n".as_bytes(),
            TraceFormat::Mooncake,
            window(0.0, 1.0, 60),
            "t.jsonl",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("t.jsonl: line 2") && e.contains("JSON object"), "{e}");
        // A byte-order mark before the first row is not part of it.
        let got = read(
            "\u{feff}{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n".as_bytes(),
            TraceFormat::Mooncake,
            window(0.0, 1.0, 60),
            "t.jsonl",
        )
        .unwrap();
        assert_eq!(got.len(), 1);
    }
}
