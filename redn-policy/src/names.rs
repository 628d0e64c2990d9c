//! The rule for names, one for the whole crate: app and offload names in `policy.toml`, and
//! the names and labels of offload definition files (`offloads.d/NAME.toml`).

/// Longest app or offload name, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// Check `text` against the rule: 1 to [`MAX_NAME_LEN`] letters, digits, `_`, `-` or `.`,
/// starting with a letter or digit. `Err` says what a name must be, for the caller's message.
pub(crate) fn check_name(text: &str) -> Result<(), String> {
    let ok = (1..=MAX_NAME_LEN).contains(&text.len())
        && text.starts_with(|c: char| c.is_ascii_alphanumeric())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "expected 1 to {MAX_NAME_LEN} letters, digits, '_', '-' or '.', starting with a letter or digit"
        ))
    }
}
