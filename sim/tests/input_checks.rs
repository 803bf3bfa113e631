//! What the CLI reads from a user's files is read as written or refused
//! naming what to fix — the file, the line, the field — with exit 2, never a
//! panic, and every input left byte for byte as it was: trace files quoted
//! as RFC 4180 writes them, not UTF-8, or of the wrong shape; names that
//! would drive the terminal; settings that quietly do nothing (warnings,
//! which `--strict` refuses); fuzz bounds that draw invalid scenarios; and
//! errors that once named the wrong field.

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;

use support::{bin, temp_file};

/// A short run replaying `calls.csv` (or whatever `file` names).
const REPLAYED: &str = r#"
name = "replayed"
duration_s = 20
[hardening]
max_tokens = 1000
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, replay = { file = "FILE" } }]
"#;

fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Writes raw `bytes` beside `near` as `name` and returns its path.
fn write_bytes(near: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = near.with_file_name(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Runs `args`, expects exit `code` with every one of `says` on stderr, and
/// every file in `inputs` as it was before.
fn expect(args: &[&str], code: i32, says: &[&str], inputs: &[&Path]) -> String {
    let before: Vec<Vec<u8>> = inputs.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let out = run(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let text = format!("{}{err}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(out.status.code(), Some(code), "{args:?}: {text}");
    assert!(!err.contains("panicked"), "{text}");
    for what in says {
        assert!(err.contains(what), "{args:?}: expected {what:?} in: {err}");
    }
    for (p, b) in inputs.iter().zip(before) {
        assert_eq!(std::fs::read(p).unwrap(), b, "{} was changed", p.display());
    }
    text
}

/// A scenario replaying a trace file `name` holding `bytes`.
fn replaying(dir: &str, name: &str, bytes: &[u8]) -> (PathBuf, PathBuf) {
    let scenario = temp_file(&format!("{dir}/replay.toml"), &REPLAYED.replace("FILE", name));
    let trace = write_bytes(&scenario, name, bytes);
    (scenario, trace)
}

const HEADER: &str = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n";

#[test]
fn a_trace_with_quoted_fields_is_read_as_rfc_4180_writes_them() {
    let csv = format!("{HEADER}2,\"Chat, GPT\",20,30,50,\"a \"\"quoted\"\" log\"\n3,ChatGPT,\"21\",31,52,API log\n");
    let (scenario, trace) = replaying("quoted", "calls.csv", csv.as_bytes());
    let text = expect(&["run", s(&scenario)], 0, &[], &[&scenario, &trace]);
    assert!(text.contains("replay:"), "{text}");
}

#[test]
fn a_trace_field_spanning_lines_is_refused_with_its_line() {
    let csv = format!("{HEADER}2,ChatGPT,20,30,50,\"a log\nthat goes on\"\n");
    let (scenario, trace) = replaying("spanning", "calls.csv", csv.as_bytes());
    expect(
        &["run", s(&scenario)],
        2,
        &[
            "workers[0].tenants[0].replay",
            "calls.csv: line 2",
            "field 6",
            "spanning lines",
        ],
        &[&scenario, &trace],
    );
}

#[test]
fn a_trace_that_is_not_utf8_is_refused_with_its_line() {
    let mut csv = format!("{HEADER}2,ChatGPT,20,30,50,API log\n3,Chat").into_bytes();
    csv.extend_from_slice(b"\xff\xfeGPT,20,30,50,API log\n");
    let (scenario, trace) = replaying("latin1", "calls.csv", &csv);
    expect(
        &["run", s(&scenario)],
        2,
        &["workers[0].tenants[0].replay", "calls.csv: line 3", "not UTF-8"],
        &[&scenario, &trace],
    );
    let jsonl =
        b"{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n{\"timestamp\": 5, \"note\": \"\xe9\"}\n";
    let (scenario, trace) = replaying("latin1", "calls.jsonl", jsonl);
    expect(
        &["run", s(&scenario)],
        2,
        &["calls.jsonl: line 2", "not UTF-8"],
        &[&scenario, &trace],
    );
}

#[test]
fn a_mooncake_row_that_is_an_array_is_refused() {
    let jsonl = b"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2}\n[1000, 10, 2]\n";
    let (scenario, trace) = replaying("array", "calls.jsonl", jsonl);
    expect(
        &["run", s(&scenario)],
        2,
        &["workers[0].tenants[0].replay", "calls.jsonl: line 2", "JSON object"],
        &[&scenario, &trace],
    );
}

#[test]
fn a_name_with_a_bidirectional_control_is_refused() {
    for c in ['\u{202E}', '\u{2066}', '\u{200F}', '\u{061C}'] {
        let text = REPLAYED
            .replace("name = \"replayed\"", &format!("name = \"ok{c}deyalper\""))
            .replace(
                "{ id = 1, replay = { file = \"FILE\" } }",
                "{ id = 1, calls_per_min = 6 }",
            );
        let scenario = temp_file("bidi/name.toml", &text);
        expect(
            &["run", s(&scenario)],
            2,
            &["line 2: field `name`", "bidirectional"],
            &[&scenario],
        );
    }
}
