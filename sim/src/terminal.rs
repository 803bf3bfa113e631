//! Text from a file that the CLI prints must not drive the terminal: a
//! control character (an ANSI escape, a carriage return, a newline) would
//! forge or hide report lines, and a Unicode bidirectional control would
//! reorder what is shown — `char::is_control` alone misses those, which are
//! format characters. Every check of printed text uses [`is_unsafe`].

/// Whether `c` must not reach the terminal from a file: a control character
/// (`char::is_control`) or a Unicode bidirectional control — the embeddings
/// and overrides U+202A–U+202E, the isolates U+2066–U+2069, the marks
/// U+200E, U+200F and U+061C.
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}')
}

/// Whether `text` holds a character [`is_unsafe`] refuses.
pub fn has_unsafe(text: &str) -> bool {
    text.chars().any(is_unsafe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_every_bidirectional_control_are_unsafe() {
        for c in ['\u{1b}', '\n', '\r', '\u{7f}', '\u{85}'] {
            assert!(is_unsafe(c), "{c:?}");
        }
        let bidi = ('\u{202A}'..='\u{202E}')
            .chain('\u{2066}'..='\u{2069}')
            .chain(['\u{200E}', '\u{200F}', '\u{061C}']);
        for c in bidi {
            assert!(is_unsafe(c), "U+{:04X}", u32::from(c));
            assert!(
                !c.is_control(),
                "U+{:04X} is caught by is_control already",
                u32::from(c)
            );
        }
        for c in ['a', 'é', '€', '日', ' ', '\u{2065}', '\u{2010}', '\u{200D}'] {
            assert!(!is_unsafe(c), "{c:?}");
        }
        assert!(has_unsafe("gpu\u{202E}lmth.exe"));
        assert!(!has_unsafe("a plain name, with commas"));
    }
}
