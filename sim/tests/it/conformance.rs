//! The conformance suite: one scenario per failure users report in LLM
//! gateways (`scenarios/conformance/`, `docs/conformance.md`). Each cites
//! its thread, passes with the correct hardening, and is the targeted
//! scenario of a catalogued variant that behaves as the gateway did — so
//! each is proven able to fail (`mutants.rs` catches each variant).

use std::path::Path;

use redstring_sim::scenario::Scenario;
use redstring_sim::search::mutants::{CATALOGUE, CONFORMANCE_DIR};

use crate::support::scenarios_dir;

fn conformance_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(scenarios_dir().join(CONFORMANCE_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".toml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_conformance_scenario_is_a_variants_target_and_every_target_exists() {
    let files = conformance_files();
    assert!(files.len() >= 5, "{files:?}");
    let targets: Vec<&str> = CATALOGUE
        .iter()
        .filter(|v| v.is_conformance())
        .map(|v| v.scenario)
        .collect();
    for file in &files {
        let path = format!("{CONFORMANCE_DIR}/{file}");
        assert!(
            targets.contains(&path.as_str()),
            "{path} is no variant's targeted scenario: nothing proves it can fail"
        );
    }
    for target in targets {
        assert!(scenarios_dir().join(target).is_file(), "{target} is missing");
    }
}

#[test]
fn every_conformance_scenario_cites_the_thread_it_reproduces() {
    for file in conformance_files() {
        let scenario = Scenario::load(&scenarios_dir().join(CONFORMANCE_DIR).join(&file)).unwrap();
        let d = &scenario.description;
        assert!(
            d.contains('#') && d.contains('/') && d.contains('\''),
            "{file}: the description must name the thread (owner/repo#n) and quote its ask: {d:?}"
        );
    }
}

#[test]
fn check_passes_the_conformance_suite() {
    let output = crate::support::bin()
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .args(["check", "scenarios/conformance"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for file in conformance_files() {
        let name = file.trim_end_matches(".toml");
        assert!(stdout.contains(name), "{name} not checked:\n{stdout}");
    }
}
