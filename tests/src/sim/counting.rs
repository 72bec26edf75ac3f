//! The counting task `sparkgate bench`'s structured phase sends, answered as a model that
//! follows it would: the JSON array it asks for, a token per number and separator.

/// `N` of "Count from 1 to N … JSON array …" (`sparkgate bench`'s structured prompt), as a
/// model that follows it would answer; up to 1000, the vocabulary's numbers.
fn counting_task(prompt: &str) -> Option<u32> {
    let (_, rest) = prompt.split_once("Count from 1 to ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let n = digits.parse::<u32>().ok().filter(|n| (1..=1000).contains(n))?;
    prompt.contains("JSON array").then_some(n)
}

/// `[1, 2, …, n]` as tokens: `[`, `1`, then `,` and ` k` for each next number, `]`.
fn counting_answer(n: u32) -> Vec<String> {
    let mut tokens = vec!["[".to_owned(), "1".to_owned()];
    for k in 2..=n {
        tokens.push(",".into());
        tokens.push(format!(" {k}"));
    }
    tokens.push("]".into());
    tokens
}

/// The answer tokens for a counting task, or `None` when `prompt` is not one.
pub(crate) fn answer(prompt: &str) -> Option<Vec<String>> {
    counting_task(prompt).map(counting_answer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::vocab::split_tokens;

    #[test]
    fn the_counting_task_is_answered_with_the_json_array() {
        let prompt = "Count from 1 to 150. Answer with only a JSON array of the numbers, like [1, 2, 3], nothing else.";
        let text = answer(prompt).unwrap().concat();
        let numbers: Vec<u32> = serde_json::from_str(&text).unwrap();
        assert_eq!(numbers, (1..=150).collect::<Vec<_>>());
        assert_eq!(answer(prompt).unwrap().len(), 301);
        assert_eq!(
            split_tokens(&text).len(),
            301,
            "one entry per token, as the tokenizer splits it"
        );
        assert!(counting_task("Count from 1 to 150 in prose").is_none());
    }
}
