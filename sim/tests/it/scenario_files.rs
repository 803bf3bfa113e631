//! Every shipped scenario file parses and validates.

use redstring_sim::scenario::Scenario;

use crate::support::scenarios_dir;

#[test]
fn every_shipped_scenario_loads() {
    let dir = scenarios_dir();
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|x| x == "toml") {
            let s = Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                path.file_stem().unwrap().to_str().unwrap(),
                s.name,
                "file name matches scenario name"
            );
            n += 1;
        }
    }
    assert!(n >= 10, "only {n} scenarios");
}
