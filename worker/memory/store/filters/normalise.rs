//! Cleaning a model's line into the text the filters judge and the store keeps: spacing,
//! bullets, quotes and casing, with no rule yet about what the text says.

const QUOTES: &[char] = &['"', '\'', '`', '“', '”', '‘', '’', '«', '»'];

/// Trims, collapses whitespace, strips list bullets and surrounding quotes. No casing or
/// length rules: shared by facts and evidence.
pub fn clean_text(raw: &str) -> String {
    let mut s: String = raw.split_whitespace().collect::<Vec<_>>().join(" ");
    loop {
        let before = s.len();
        s = strip_bullet(&s).to_string();
        if let (Some(first), Some(last)) = (s.chars().next(), s.chars().last()) {
            if s.chars().count() >= 2 && QUOTES.contains(&first) && QUOTES.contains(&last) {
                s = s[first.len_utf8()..s.len() - last.len_utf8()]
                    .trim()
                    .to_string();
            }
        }
        if s.len() == before {
            return s;
        }
    }
}

fn strip_bullet(s: &str) -> &str {
    let t = s.trim_start();
    for b in ["- ", "* ", "• ", "· ", "– ", "— ", "> "] {
        if let Some(rest) = t.strip_prefix(b) {
            return rest.trim_start();
        }
    }
    // Numbered items: "1. ", "2) ".
    let digits = t.chars().take_while(char::is_ascii_digit).count();
    if digits > 0 && digits <= 2 {
        let rest = &t[digits..];
        for sep in [". ", ") "] {
            if let Some(r) = rest.strip_prefix(sep) {
                return r.trim_start();
            }
        }
    }
    t
}

/// A fact as stored: cleaned, first letter upper-cased, ending in terminal punctuation.
pub fn normalise_fact(raw: &str) -> String {
    let s = clean_text(raw);
    let s = s.trim_end_matches([',', ';', ':']).trim_end();
    if s.is_empty() {
        return String::new();
    }
    let mut chars = s.chars();
    let first = chars.next().expect("non-empty");
    let mut out: String = first.to_uppercase().chain(chars).collect();
    if !out.ends_with(['.', '!', '?']) {
        out.push('.');
    }
    out
}

/// Lowercase, typographic apostrophes folded, whitespace collapsed: the form the
/// instruction and secret rules match against.
pub(super) fn match_form(s: &str) -> String {
    s.replace(['’', '‘'], "'")
        .to_lowercase()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}
