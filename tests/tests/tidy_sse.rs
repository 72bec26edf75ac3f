//! No hand-written `data:` line parser in any crate: server-sent events are read by
//! eventsource-stream (`sparkgate_tests::sse::events` in the tests), so every reader agrees with
//! a client's reading. The one exception is the gateway's hot tap, which cuts events in place
//! to pass them on without a copy, and is held to eventsource-stream by a property test.

use std::path::{Path, PathBuf};

use sparkgate_tests::tidy::{root, rust_files, CRATES};

/// Files allowed a hand-written `data:` parser, with why.
const ALLOWED: &[(&str, &str)] = &[
    (
        "gateway/src/pipeline/relay.rs",
        "the hot tap: cuts events in place, property-tested against eventsource-stream",
    ),
    (
        "gateway/src/pipeline/trace.rs",
        "the hot tap's record of a stream that can be continued: each event the tap cut, its token ids read in place",
    ),
    ("tests/tests/tidy_sse.rs", "this test's own samples"),
];

/// The calls that, on a line naming `"data:`, take the line apart by hand.
const CALLS: &[&str] = &[
    "strip_prefix(",
    "starts_with(",
    "split(",
    "split_once(",
    "find(",
    "trim_start_matches(",
];

/// Whether `line` parses an SSE `data:` line by hand: it names `"data:` (or `b"data:`) and
/// takes text apart with one of CALLS. A writer (`format!("data: {x}\n\n")`) does not.
fn parses_data_by_hand(line: &str) -> bool {
    let names_data = ["\"data:", "b\"data:"].iter().any(|d| line.contains(d));
    names_data && CALLS.iter().any(|c| line.contains(c))
}

/// Every `.rs` file in the crates' `src/` and `tests/` folders, with its path from the root.
fn workspace_files() -> Vec<(PathBuf, String)> {
    let root = root();
    let files: Vec<(PathBuf, String)> = CRATES
        .iter()
        .flat_map(|c| ["src", "tests"].map(|d| root.join(c).join(d)))
        .flat_map(|dir| rust_files(&dir))
        .map(|p| {
            let rel = relative(&root, &p);
            (p, rel)
        })
        .collect();
    assert!(files.len() > 100, "found the workspace's sources");
    files
}

fn relative(root: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(root).expect("under the root");
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

#[test]
fn no_data_line_is_parsed_by_hand_outside_the_hot_tap() {
    let mut found = Vec::new();
    for (file, rel) in workspace_files() {
        if ALLOWED.iter().any(|(f, _)| *f == rel) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read");
        for (i, line) in text.lines().enumerate() {
            if !parses_data_by_hand(line) {
                continue;
            }
            found.push(format!("{rel}:{}: {}", i + 1, line.trim()));
        }
    }
    assert!(
        found.is_empty(),
        "`data:` lines parsed by hand; read the stream with eventsource-stream \
         (sparkgate_tests::sse::events in the tests): {found:#?}"
    );
}

#[test]
fn every_allowed_file_exists() {
    for (file, why) in ALLOWED {
        assert!(root().join(file).is_file(), "{file} ({why}) is gone: update ALLOWED");
    }
}

#[test]
fn the_matcher_catches_a_parser_and_passes_a_writer() {
    for parser in [
        r#"let payload = line.strip_prefix("data: ")?;"#,
        r#"if event.starts_with(b"data:") {"#,
        r#"let d = block.split("data: ").nth(1);"#,
        r#"let (_, d) = block.split_once("data:").unwrap();"#,
        r#"let at = text.find("data: [DONE]");"#,
        r#"let d = l.trim_start_matches("data:");"#,
    ] {
        assert!(parses_data_by_hand(parser), "missed: {parser}");
    }
    for other in [
        r#"out.push_str(&format!("data: {x}\n\n"));"#,
        r#"let events = sse::events(&body);"#,
        r#"assert!(text.ends_with("data: [DONE]\n\n"));"#,
        r#"let name = line.strip_prefix("event: ");"#,
    ] {
        assert!(!parses_data_by_hand(other), "flagged: {other}");
    }
}
