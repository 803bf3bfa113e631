//! Property tests for the header parsers: no header a server sends can make
//! them panic, and what they return is always a wait the client can sleep on.
//!
//! `PROPTEST_CASES=20000 cargo test -p redstring --lib header_properties`
//! runs a deeper search.

use std::time::Duration;

use proptest::prelude::*;

use super::{parse_http_date, retry_after};
use crate::provider::HttpResponse;
use crate::time::Timestamp;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(512),
        ..ProptestConfig::default()
    }
}

/// Header values: arbitrary text, and text shaped like the forms the parsers
/// accept with every field free to be huge, negative or malformed.
fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ -~]{0,40}",
        "(Mon|Tue|Wed|Thu|Fri|Sat|Sun|[A-Za-z]{1,4}), -?[0-9]{1,22} (Jan|Feb|Nov|Dec|[A-Za-z]{3}) -?[0-9]{1,25} -?[0-9]{1,22}:-?[0-9]{1,22}:-?[0-9]{1,22} (GMT|UTC)",
        "(Sunday|Monday), [0-9]{1,3}-(Nov|Feb)-[0-9]{1,20} [0-9]{1,3}:[0-9]{1,3}:[0-9]{1,3} GMT",
        "(Sun|Mon) (Nov|Feb) [ 0-9]{1,3} [0-9]{1,3}:[0-9]{1,3}:[0-9]{1,3} [0-9]{1,25}",
        "-?[0-9]{0,400}(\\.[0-9]{0,400})?(e-?[0-9]{1,5})?",
        prop_oneof![Just("inf"), Just("NaN"), Just("-0"), Just("1e308"), Just("+Infinity")].prop_map(String::from),
    ]
}

fn now() -> impl Strategy<Value = Timestamp> {
    prop_oneof![
        Just(Timestamp::EPOCH),
        Just(Timestamp::from_micros(u64::MAX)),
        (0u64..=u64::MAX).prop_map(Timestamp::from_micros),
    ]
}

proptest! {
    #![proptest_config(config())]

    /// An HTTP date either parses to an instant or is refused; nothing panics.
    #[test]
    fn http_dates_never_panic(value in header_value()) {
        let _ = parse_http_date(&value);
    }

    /// `retry-after` and `retry-after-ms`, in any combination, give a finite
    /// wait or none, never a panic.
    #[test]
    fn retry_after_never_panics(
        seconds in proptest::option::of(header_value()),
        millis in proptest::option::of(header_value()),
        now in now(),
    ) {
        let mut headers = Vec::new();
        if let Some(v) = seconds {
            headers.push(("retry-after".to_owned(), v));
        }
        if let Some(v) = millis {
            headers.push(("retry-after-ms".to_owned(), v));
        }
        let response = HttpResponse { status: 429, headers, body: Vec::new() };
        if let Some(wait) = retry_after(&response, now) {
            prop_assert!(wait <= Duration::MAX);
        }
    }

    /// A date the parser accepts is the instant it names, exactly.
    #[test]
    fn accepted_dates_round_trip(secs in 0u64..253_402_300_800) {
        let text = httpdate::fmt_http_date(std::time::UNIX_EPOCH + Duration::from_secs(secs));
        prop_assert_eq!(parse_http_date(&text), Some(Timestamp::from_secs(secs)));
    }
}

#[test]
fn the_reported_overflow_is_refused() {
    let value = "Sun, 06 Nov 9223372036854775807 08:49:37 GMT";
    assert_eq!(parse_http_date(value), None);
    let response = HttpResponse {
        status: 429,
        headers: vec![("retry-after".into(), value.into())],
        body: Vec::new(),
    };
    assert_eq!(retry_after(&response, Timestamp::from_secs(1_700_000_000)), None);
}
