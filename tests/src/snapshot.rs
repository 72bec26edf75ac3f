//! Snapshot comparison of command output: what an operator reads is kept in
//! `tests/snapshots/*.txt`, with what changes from run to run (numbers, temporary paths, the
//! port) masked, so a change in wording, order or layout fails a test and is reviewed.
//!
//! `SPARKGATE_BLESS=1` writes the current output as the new snapshot instead of comparing.

use std::path::PathBuf;

/// `text` with each `(literal, name)` replaced by `<name>`, every number not glued to a word
/// (`epoch 3`, `12.5 s`, not `v4.1` or `rank0`) by `#`, runs of spaces inside a line by two
/// (column padding follows the masked widths), trailing spaces dropped, and a line repeated
/// right after itself once (a phase shown again with other numbers: `0/2 ranks up`, `2/2 …`).
pub fn masked(text: &str, literals: &[(&str, &str)]) -> String {
    let mut t = text.to_owned();
    for (literal, name) in literals.iter().filter(|(l, _)| !l.is_empty()) {
        t = t.replace(literal, &format!("<{name}>"));
    }
    let mut lines: Vec<String> = t.lines().map(mask_line).collect();
    lines.dedup();
    lines.join("\n") + "\n"
}

fn mask_line(line: &str) -> String {
    let body = line.trim_start();
    if body.is_empty() {
        return String::new();
    }
    let mut out = line[..line.len() - body.len()].to_owned();
    let chars: Vec<char> = body.trim_end().chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let glued = i > 0 && chars[i - 1].is_ascii_alphabetic();
        if c.is_ascii_digit() {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_digit()
                    || (chars[i] == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)))
            {
                i += 1;
            }
            if glued {
                out.extend(&chars[start..i]);
            } else {
                out.push('#');
            }
            continue;
        }
        if c == ' ' && chars.get(i + 1) == Some(&' ') {
            while chars.get(i) == Some(&' ') {
                i += 1;
            }
            out.push_str("  ");
            continue;
        }
        out.push(c);
        i += 1;
    }
    out
}

fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("snapshots")
        .join(format!("{name}.txt"))
}

/// Fails unless `text`, masked, equals the snapshot `name` (or writes it under SPARKGATE_BLESS).
pub fn assert_snapshot(name: &str, text: &str, literals: &[(&str, &str)]) {
    let actual = masked(text, literals);
    let file = path(name);
    if std::env::var_os("SPARKGATE_BLESS").is_some() {
        std::fs::create_dir_all(file.parent().expect("snapshots dir")).expect("create snapshots dir");
        std::fs::write(&file, &actual).expect("write snapshot");
        return;
    }
    let expected = std::fs::read_to_string(&file).unwrap_or_else(|e| {
        panic!(
            "snapshot {} ({e}); run with SPARKGATE_BLESS=1 to write it:\n{actual}",
            file.display()
        )
    });
    assert!(
        expected == actual,
        "output differs from snapshot {} (SPARKGATE_BLESS=1 rewrites it)\n--- expected\n{expected}--- actual\n{actual}",
        file.display()
    );
}

#[cfg(test)]
mod tests {
    use super::masked;

    #[test]
    fn numbers_paths_and_padding_are_masked() {
        let text = "rank  node    state\n0     head    running  pid 4123     12 s   /tmp/x/rank0.log  \n";
        assert_eq!(
            masked(text, &[("/tmp/x", "LOG_DIR")]),
            "rank  node  state\n#  head  running  pid #  # s  <LOG_DIR>/rank0.log\n"
        );
        assert_eq!(masked("ready in 1.25 s: epoch 3.", &[]), "ready in # s: epoch #.\n");
        assert_eq!(
            masked("{\n  \"a\":  1\n}", &[]),
            "{\n  \"a\":  #\n}\n",
            "indentation kept"
        );
        assert_eq!(masked("DeepSeek-v4.1 on 127.0.0.1:80", &[]), "DeepSeek-v4.1 on #:#\n");
        assert_eq!(masked("  1 s  up 0/2\n  2 s  up 2/2\n", &[]), "  # s  up #/#\n");
    }
}
