//! Objectives: whether this configuration met its users' needs.
//!
//! Apart from the invariants (did the library keep its promises), a scenario
//! may set targets in `[objectives]` ([`Objectives`]). Each set target
//! is compared with its figure ([`Figures`]) and gets a verdict: met, missed
//! (with the measured value beside the target), or not applicable (with why).
//! A missed objective makes `run` exit 5; a failed invariant still wins with 1.

use serde::Serialize;

use crate::judgement::figures::{Figures, RECOVERY_PERCENT, RECOVERY_WINDOW_S, Recovery};
use crate::scenario::Objectives;

/// The verdict on one objective.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Judged {
    /// The figure is within the target.
    Met {
        /// The figure.
        measured: f64,
    },
    /// The figure is beyond the target (`measured` is `None` when goodput
    /// never came back).
    Missed {
        /// The figure.
        measured: Option<f64>,
        /// Why, when there is no figure.
        #[serde(skip_serializing_if = "Option::is_none")]
        why: Option<String>,
    },
    /// The run gives nothing to measure.
    NotApplicable {
        /// Why.
        why: String,
    },
}

/// One objective's target and verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ObjectiveVerdict {
    /// The objective, as the scenario names it.
    pub name: &'static str,
    /// The target: the largest acceptable figure.
    pub target: f64,
    /// The verdict.
    #[serde(flatten)]
    pub judged: Judged,
}

impl ObjectiveVerdict {
    /// Whether the objective was missed.
    pub fn missed(&self) -> bool {
        matches!(self.judged, Judged::Missed { .. })
    }

    /// Whether the objective was met.
    pub fn met(&self) -> bool {
        matches!(self.judged, Judged::Met { .. })
    }
}

/// Compares `measured` with `target` (met when at or below it).
fn compare(measured: f64, target: f64) -> Judged {
    if measured <= target {
        Judged::Met { measured }
    } else {
        Judged::Missed {
            measured: Some(measured),
            why: None,
        }
    }
}

fn or_na(measured: Option<f64>, target: f64, why: &str) -> Judged {
    measured.map_or_else(|| Judged::NotApplicable { why: why.to_owned() }, |m| compare(m, target))
}

/// The verdict on every objective `objectives` sets, in a fixed order
/// (the order of the fields of [`Objectives`]).
pub fn judge(objectives: &Objectives, figures: &Figures) -> Vec<ObjectiveVerdict> {
    let mut out = Vec::new();
    if let Some(target) = objectives.goodput_recovery_s {
        let judged = match &figures.goodput_recovery {
            Recovery::Recovered { s } => compare(*s, target),
            Recovery::NoFault => Judged::NotApplicable {
                why: "no fault, so nothing to recover from".into(),
            },
            Recovery::TooLate => Judged::NotApplicable {
                why: format!("the run ends less than {RECOVERY_WINDOW_S} s after the last fault is over"),
            },
            Recovery::NotReady => Judged::Missed {
                measured: None,
                why: Some("a restarted server was not ready again within the run".into()),
            },
            Recovery::NotRecovered => Judged::Missed {
                measured: None,
                why: Some(format!(
                    "no {RECOVERY_WINDOW_S} s window after the last fault had {RECOVERY_PERCENT} % of offered calls ok"
                )),
            },
        };
        out.push(ObjectiveVerdict {
            name: "goodput_recovery_s",
            target,
            judged,
        });
    }
    if let Some(max) = objectives.impaired_requests_max {
        out.push(ObjectiveVerdict {
            name: "impaired_requests_max",
            target: max as f64,
            judged: compare(figures.impaired_requests as f64, max as f64),
        });
    }
    if let Some(target) = objectives.failed_fraction_max {
        out.push(ObjectiveVerdict {
            name: "failed_fraction_max",
            target,
            judged: or_na(figures.failed_fraction, target, "no call ended outside the limiter"),
        });
    }
    if let Some(target) = objectives.high_failed_fraction_max {
        let judged = match figures.classes.get(redstring::Priority::High.as_str()) {
            None => Judged::NotApplicable {
                why: "the scenario's tenants are not of both priority classes".into(),
            },
            Some(high) => or_na(high.failed_fraction, target, "no high-priority call was judged"),
        };
        out.push(ObjectiveVerdict {
            name: "high_failed_fraction_max",
            target,
            judged,
        });
    }
    if let Some(target) = objectives.p99_latency_s {
        out.push(ObjectiveVerdict {
            name: "p99_latency_s",
            target,
            judged: or_na(figures.latency_p99_s, target, "no call ended outside the limiter"),
        });
    }
    if let Some(target) = objectives.amplification_max {
        out.push(ObjectiveVerdict {
            name: "amplification_max",
            target,
            judged: or_na(
                figures.retry_amplification,
                target,
                "no call was admitted by the limiter",
            ),
        });
    }
    if let Some(max) = objectives.throttled_requests_max {
        out.push(ObjectiveVerdict {
            name: "throttled_requests_max",
            target: max as f64,
            judged: compare(figures.throttled_requests as f64, max as f64),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(recovery: Recovery) -> Figures {
        Figures {
            latency_p50_s: Some(0.5),
            latency_p95_s: Some(1.0),
            latency_p99_s: Some(2.0),
            failed_fraction: Some(0.1),
            impaired_requests: 7,
            retry_amplification: None,
            calls_deferred: 0,
            throttled_requests: 1,
            goodput_recovery: recovery,
            episodes: Vec::new(),
            classes: Default::default(),
        }
    }

    #[test]
    fn unset_objectives_get_no_verdict() {
        assert!(judge(&Objectives::default(), &figures(Recovery::NoFault)).is_empty());
    }

    #[test]
    fn each_set_objective_is_met_missed_or_not_applicable() {
        let o = Objectives {
            goodput_recovery_s: Some(10.0),
            impaired_requests_max: Some(6),
            failed_fraction_max: Some(0.1),
            high_failed_fraction_max: None,
            p99_latency_s: Some(1.5),
            amplification_max: Some(2.0),
            throttled_requests_max: Some(0),
        };
        let v = judge(&o, &figures(Recovery::Recovered { s: 4.0 }));
        let names: Vec<&str> = v.iter().map(|v| v.name).collect();
        assert_eq!(
            names,
            [
                "goodput_recovery_s",
                "impaired_requests_max",
                "failed_fraction_max",
                "p99_latency_s",
                "amplification_max",
                "throttled_requests_max"
            ]
        );
        assert_eq!(v[0].judged, Judged::Met { measured: 4.0 });
        assert_eq!(
            v[1].judged,
            Judged::Missed {
                measured: Some(7.0),
                why: None
            }
        );
        // At the target is met.
        assert_eq!(v[2].judged, Judged::Met { measured: 0.1 });
        assert!(v[3].missed());
        assert!(matches!(v[4].judged, Judged::NotApplicable { .. }));
        // One 429 against none allowed.
        assert_eq!(
            v[5].judged,
            Judged::Missed {
                measured: Some(1.0),
                why: None
            }
        );
    }

    #[test]
    fn the_high_class_objective_judges_its_own_calls_only() {
        use crate::judgement::figures::ClassFigures;
        let o = Objectives {
            high_failed_fraction_max: Some(0.05),
            ..Objectives::default()
        };
        let one = |f: &Figures| judge(&o, f).remove(0);
        let mut f = figures(Recovery::NoFault);
        assert!(
            matches!(&one(&f).judged, Judged::NotApplicable { why } if why.contains("both priority classes")),
            "no classes"
        );
        let class = |failed| ClassFigures {
            calls: 40,
            deferred: 0,
            failed_fraction: failed,
        };
        f.classes.insert("high".into(), class(Some(0.05)));
        f.classes.insert("low".into(), class(Some(0.5)));
        // The run's 0.1 would miss; the high class's 0.05 is met.
        let v = one(&f);
        assert_eq!(
            (v.name, v.judged),
            ("high_failed_fraction_max", Judged::Met { measured: 0.05 })
        );
        f.classes.insert("high".into(), class(Some(0.1)));
        assert!(one(&f).missed());
        f.classes.insert("high".into(), class(None));
        assert!(matches!(one(&f).judged, Judged::NotApplicable { .. }));
    }

    #[test]
    fn recovery_verdicts_follow_the_recovery() {
        let o = Objectives {
            goodput_recovery_s: Some(10.0),
            ..Objectives::default()
        };
        let one = |r| judge(&o, &figures(r)).remove(0).judged;
        assert!(matches!(one(Recovery::NoFault), Judged::NotApplicable { why } if why.contains("no fault")));
        assert!(matches!(one(Recovery::TooLate), Judged::NotApplicable { .. }));
        assert!(matches!(
            one(Recovery::NotRecovered),
            Judged::Missed { measured: None, .. }
        ));
        assert!(matches!(one(Recovery::Recovered { s: 11.0 }), Judged::Missed { .. }));
    }
}
