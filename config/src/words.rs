//! Splitting a command-line knob (SELF_CHECK_CMD) into argv words, POSIX-shell style.

/// Splits a command line into words the way a POSIX shell would for plain words, "double" and
/// 'single' quotes (no expansions); `None` for an unterminated quote.
pub(crate) fn shell_words(line: &str) -> Option<Vec<String>> {
    let (mut words, mut word, mut in_word, mut quote) = (Vec::new(), String::new(), false, None::<char>);
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') => match chars.next() {
                Some(n @ ('"' | '\\')) => word.push(n),
                Some(n) => {
                    word.push('\\');
                    word.push(n);
                }
                None => return None,
            },
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return None;
    }
    if in_word {
        words.push(word);
    }
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::shell_words;

    #[test]
    fn quotes_group_words_and_unterminated_ones_are_refused() {
        assert_eq!(
            shell_words(r#"bash -c "python3 a.py && python3 'b c'.py""#).unwrap(),
            ["bash", "-c", "python3 a.py && python3 'b c'.py"]
        );
        assert_eq!(shell_words("vllm selfcheck").unwrap(), ["vllm", "selfcheck"]);
        assert_eq!(shell_words("").unwrap(), Vec::<String>::new());
        assert!(shell_words("bash -c \"oops").is_none());
    }
}
