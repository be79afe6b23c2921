//! Shortening text we echo back: client input in an error message or a dead-letter reason is
//! useful up to a point, megabytes of it are not.

/// `text` cut to at most `limit` characters, with `…` appended when anything was cut.
pub fn truncate_chars(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// The longest prefix of `text` of at most `max_bytes` bytes that ends on a character boundary
/// (for fields whose limit is in bytes, such as AMQP short strings).
pub fn truncate_bytes(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_are_counted_not_bytes() {
        assert_eq!(truncate_chars("héllo", 2), "hé…");
        assert_eq!(truncate_chars("héllo", 5), "héllo");
        assert_eq!(truncate_chars("", 0), "");
        assert_eq!(truncate_chars("ab", 0), "…");
    }

    #[test]
    fn bytes_end_on_a_character_boundary() {
        assert_eq!(truncate_bytes("héllo", 2), "h");
        assert_eq!(truncate_bytes("héllo", 3), "hé");
        assert_eq!(truncate_bytes("abc", 10), "abc");
    }
}
