//! The documentation as a reader meets it: every Markdown table renders as a table (a header, a
//! separator row, the same number of cells in every row — a blank line inside a table turns its
//! rest into raw `|` text), the README names only commands the CLI has, and the README stays one
//! screen's worth, and operations.md's event table is the code's (`sparkgate_events`).

use std::path::{Path, PathBuf};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// README, the top-level documents and everything under `docs/` and `tests/` that is Markdown.
fn documents() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md"]
        .iter()
        .map(|f| root().join(f))
        .collect();
    for dir in ["docs", "tests"] {
        let entries = std::fs::read_dir(root().join(dir)).expect("dir");
        files.extend(
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "md")),
        );
    }
    files
}

/// The lines outside fenced code blocks, with their numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// A table row's cells: split at every `|` that is not escaped (GFM splits inside code spans
/// too), without the outer pipes.
fn cells(row: &str) -> usize {
    let bytes = row.trim().as_bytes();
    let pipes = (0..bytes.len())
        .filter(|&i| bytes[i] == b'|' && (i == 0 || bytes[i - 1] != b'\\'))
        .count();
    pipes.saturating_sub(1)
}

fn is_separator(row: &str) -> bool {
    let inner = row.trim().trim_matches('|');
    !inner.is_empty()
        && inner
            .split('|')
            .all(|c| !c.trim().is_empty() && c.trim().trim_matches(':').chars().all(|ch| ch == '-'))
}

/// What is wrong with the tables of `text`, one line per problem.
fn table_problems(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let lines = prose(text);
    let mut i = 0;
    while i < lines.len() {
        if !lines[i].1.trim_start().starts_with('|') {
            i += 1;
            continue;
        }
        let start = i;
        while i < lines.len() && lines[i].1.trim_start().starts_with('|') && lines[i].0 == lines[start].0 + (i - start)
        {
            i += 1;
        }
        let block = &lines[start..i];
        let (line, header) = block[0];
        match block.get(1) {
            Some((_, sep)) if is_separator(sep) => {
                let want = cells(header);
                for (n, row) in block.iter().skip(1) {
                    if cells(row) != want && !is_separator(row) {
                        problems.push(format!("line {n}: {} cells, the header has {want}", cells(row)));
                    } else if is_separator(row) && cells(row) != want {
                        problems.push(format!(
                            "line {n}: the separator has {} cells, the header {want}",
                            cells(row)
                        ));
                    }
                }
            }
            _ => problems.push(format!(
                "line {line}: a table row with no separator row under it (a blank line inside a table?)"
            )),
        }
    }
    problems
}

#[test]
fn every_markdown_table_renders_as_a_table() {
    let mut all = Vec::new();
    for file in documents() {
        let text = std::fs::read_to_string(&file).expect("read");
        for p in table_problems(&text) {
            all.push(format!("{}: {p}", file.display()));
        }
    }
    assert!(all.is_empty(), "broken tables:\n{}", all.join("\n"));
}

#[test]
fn the_table_check_finds_a_split_table_and_a_short_row() {
    let split = "| a | b |\n|---|---|\n| 1 | 2 |\n\n| 3 | 4 |\n";
    assert_eq!(table_problems(split).len(), 1, "{:?}", table_problems(split));
    let short = "| a | b |\n|---|---|\n| 1 |\n";
    assert_eq!(table_problems(short).len(), 1);
    let fine = "| a | `x \\| y` |\n|---|:---:|\n| 1 | 2 |\n```\n| not a table\n```\n";
    assert!(table_problems(fine).is_empty(), "{:?}", table_problems(fine));
}

/// Subcommands named as `sparkgate WORD` in code (spans or blocks) of `text`.
fn named_commands(text: &str) -> Vec<String> {
    let mut code = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            code.push_str(line);
            code.push('\n');
        } else {
            for (k, span) in line.split('`').enumerate() {
                if k % 2 == 1 {
                    code.push_str(span);
                    code.push('\n');
                }
            }
        }
    }
    let mut out = Vec::new();
    for piece in code.split("sparkgate ").skip(1) {
        let word: String = piece
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '-')
            .collect();
        // A subcommand starts with a letter (`sparkgate -- demo` is cargo's separator).
        if word.starts_with(|c: char| c.is_ascii_lowercase()) && !out.contains(&word) {
            out.push(word);
        }
    }
    out
}

/// The CLI's subcommands, from its own help.
fn cli_commands() -> Vec<String> {
    let sparkgate = sparkgate_tests::test_gateway::sparkgate_bin(SIM);
    let out = std::process::Command::new(sparkgate)
        .arg("--help")
        .output()
        .expect("sparkgate --help");
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn the_docs_name_only_commands_the_cli_has() {
    let commands = cli_commands();
    assert!(commands.contains(&"demo".to_owned()), "{commands:?}");
    let mut unknown = Vec::new();
    for file in documents() {
        let text = std::fs::read_to_string(&file).expect("read");
        for word in named_commands(&text) {
            if !commands.contains(&word) {
                unknown.push(format!("{}: `sparkgate {word}`", file.display()));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "commands the CLI does not have:\n{}",
        unknown.join("\n")
    );
    assert_eq!(named_commands("run `sparkgate frobnicate --x`"), ["frobnicate"]);
}

#[test]
fn the_readme_is_about_one_screen() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    let lines = readme.lines().count();
    assert!(lines <= 120, "README.md has {lines} lines; move detail into docs/");
}

#[test]
fn the_event_table_in_the_docs_is_the_codes() {
    let text = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    let table = text
        .split("<!-- events:start -->")
        .nth(1)
        .and_then(|t| t.split("<!-- events:end -->").next())
        .expect("operations.md holds the event table between its markers");
    let rows: Vec<(String, String)> = table
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells[1].trim_matches('`').to_owned(), cells[2].to_owned())
        })
        .collect();
    let code: Vec<(String, String)> = sparkgate_events::Event::TABLE
        .iter()
        .map(|(name, level)| ((*name).to_owned(), level.label().to_owned()))
        .collect();
    assert_eq!(rows, code, "docs/operations.md's event table, in the code's order");
}
