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

/// Each function in `file` (its first line, where it starts, how many lines), found by its
/// closing brace at the indentation of its `fn` line, as rustfmt lays them out.
fn function_lengths(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let head = ["pub(crate) ", "pub(super) ", "pub "]
            .iter()
            .find_map(|p| body.strip_prefix(p))
            .unwrap_or(body);
        let head = head.strip_prefix("const ").unwrap_or(head);
        let head = head.strip_prefix("async ").unwrap_or(head);
        if !head.starts_with("fn ") || body.ends_with(';') {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(end) = lines[i + 1..].iter().position(|l| *l == close) {
            out.push((body.to_owned(), i + 1, end + 2));
        }
    }
    out
}

#[test]
fn no_function_in_the_config_crate_is_over_80_lines() {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/src");
    let mut files = Vec::new();
    rust_files(&config, &mut files);
    assert!(files.len() > 10, "found the config crate's sources");
    let long: Vec<String> = files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).expect("read");
            function_lengths(&text)
                .into_iter()
                .filter(|(_, _, n)| *n > 80)
                .map(|(head, at, n)| format!("{}:{at}: {n} lines: {head}", f.display()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(long.is_empty(), "functions over 80 lines: {long:#?}");
    let sample = function_lengths("fn a() {\n    x;\n}\n\n    pub(crate) fn b(&self) -> u8 {\n        1\n    }\n");
    assert_eq!(
        sample,
        [
            ("fn a() {".to_owned(), 1, 3),
            ("pub(crate) fn b(&self) -> u8 {".to_owned(), 5, 3)
        ]
    );
}

/// The top-level module a source file belongs to (`src/a/b.rs` → `a`; `x_tests.rs` → `x`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    Some(name.strip_suffix("_tests").unwrap_or(name).to_owned())
}

/// `crate::m` references between a crate's top-level modules: (from, to) pairs.
fn module_edges(src: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut edges = Vec::new();
    for file in files {
        let Some(from) = module_of(src, &file) else { continue };
        if ["lib", "main", "bin"].contains(&from.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read");
        for part in text.split("crate::").skip(1) {
            let to: String = part.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !to.is_empty() && to != from && !edges.contains(&(from.clone(), to.clone())) {
                edges.push((from.clone(), to));
            }
        }
    }
    edges
}

/// A cycle in `edges`, if there is one.
fn find_cycle(edges: &[(String, String)]) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &[(String, String)],
        path: &mut Vec<String>,
        done: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.iter().any(|d| d == node) {
            return None;
        }
        path.push(node.to_owned());
        for (_, to) in edges.iter().filter(|(f, _)| f == node) {
            if let Some(c) = visit(to, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.push(node.to_owned());
        None
    }
    let mut done = Vec::new();
    edges
        .iter()
        .find_map(|(from, _)| visit(from, edges, &mut Vec::new(), &mut done))
}

#[test]
fn the_supervisors_modules_import_each_other_in_one_direction() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../supervisor/src");
    let edges = module_edges(&src);
    assert!(edges.len() > 10, "read the supervisor's imports: {edges:?}");
    assert_eq!(find_cycle(&edges), None, "a module cycle in supervisor/");
    let cyclic = [("a", "b"), ("b", "c"), ("c", "a")].map(|(f, t)| (f.to_owned(), t.to_owned()));
    assert!(find_cycle(&cyclic).is_some(), "the check finds a cycle");
}
