//! Repository hygiene: every Rust file opens with a `//!` line saying what it owns, and no file
//! grows past the size limit without being listed here with its reason.

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 650;

/// Files allowed past MAX_LINES, with why.
const LONG_FILES: &[(&str, &str)] = &[];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("dir entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

fn workspace_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf();
    let mut files = Vec::new();
    for member in ["config", "docker", "supervisor", "prepare", "gateway", "tests"] {
        rust_files(&root.join(member), &mut files);
    }
    assert!(files.len() > 10, "found the workspace's sources");
    files
}

#[test]
fn every_rust_file_opens_with_a_module_doc_line() {
    let missing: Vec<String> = workspace_files()
        .into_iter()
        .filter(|p| !std::fs::read_to_string(p).expect("read").starts_with("//! "))
        .map(|p| p.display().to_string())
        .collect();
    assert!(missing.is_empty(), "files without a leading `//!` line: {missing:#?}");
}

#[test]
fn no_file_is_over_the_size_limit_without_a_reason() {
    let long: Vec<String> = workspace_files()
        .into_iter()
        .filter(|p| std::fs::read_to_string(p).expect("read").lines().count() > MAX_LINES)
        .filter(|p| !LONG_FILES.iter().any(|(f, _)| p.ends_with(f)))
        .map(|p| p.display().to_string())
        .collect();
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {long:#?}");
}
