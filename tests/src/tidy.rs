//! What the tidy tests read of the workspace's sources: the crates' files, each function's
//! length, and the import graph between a crate's files and folders (`crate::a::b` and
//! `super::x` paths, and a parent module's `use child::…`; re-exports are a module's face, not
//! its imports), resolved to the files that define them — the same picture `farm-studio look` draws, so a circle or an arrow back up fails CI.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace's crates, each with the folder of its sources.
pub const CRATES: &[&str] = &[
    "config",
    "task",
    "docker",
    "supervisor",
    "prepare",
    "spec",
    "gateway",
    "cli",
    "tests",
];

/// The workspace's root folder.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Every `.rs` file under `dir`, in a stable order.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    collect(dir, &mut out);
    out.sort();
    out
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" {
                collect(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// Whether a source file is test code as a whole: a `*_tests.rs` or `tests.rs` module.
pub fn is_test_file(file: &Path) -> bool {
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    name.ends_with("_tests.rs") || name == "tests.rs"
}

/// `text` up to its first `#[cfg(test)]` module (test modules close their file, by the
/// workspace's layout).
pub fn without_tests(text: &str) -> &str {
    let cut = text.match_indices("#[cfg(test)]\n").map(|(at, _)| at).find(|at| {
        let next = text[at + 13..].lines().next().unwrap_or_default();
        next.starts_with("mod ") || next.starts_with("#[path")
    });
    &text[..cut.unwrap_or(text.len())]
}

/// Each function in `text`: its first line, where it starts (1-based) and how many lines it
/// has, found by its closing brace at the indentation of its `fn` line (rustfmt's layout).
pub fn function_lengths(text: &str) -> Vec<(String, usize, usize)> {
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

/// A crate's import graph: for each of its non-test source files (relative to `src/`), the
/// files it imports.
pub type Graph = BTreeMap<PathBuf, BTreeSet<PathBuf>>;

/// The import graph of the crate whose sources are in `src`.
pub fn import_graph(src: &Path) -> Graph {
    let mut graph = Graph::new();
    for file in rust_files(src) {
        if is_test_file(&file) {
            continue;
        }
        let rel = file.strip_prefix(src).expect("under src").to_path_buf();
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let targets = imports_of(src, &rel, without_tests(&text));
        graph.insert(rel.clone(), targets.into_iter().filter(|t| *t != rel).collect());
    }
    graph
}

/// The files `text` (the file `rel` of the crate in `src`) imports.
fn imports_of(src: &Path, rel: &Path, text: &str) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let own = module_dir(rel);
    for line in text.lines().map(str::trim_start).filter(|l| !l.starts_with("//")) {
        if is_reexport(line) {
            continue; // a module's face hands names on; it does not depend on them
        }
        for (at, _) in line.match_indices("crate::") {
            let before = line[..at].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                continue; // `sparkgate_gateway::crate::…` is not ours; `$crate::` neither
            }
            out.extend(resolve(src, Path::new(""), &segments(&line[at + 7..])));
        }
        for (at, _) in line.match_indices("super::") {
            if line[..at].ends_with("super::") {
                continue; // counted from the first `super::` of the path
            }
            let (mut dir, mut rest) = (parent_dir(&own), &line[at + 7..]);
            while let Some(r) = rest.strip_prefix("super::") {
                dir = parent_dir(&dir);
                rest = r;
            }
            out.extend(resolve(src, &dir, &segments(rest)));
        }
        if is_module_root(rel) {
            out.extend(child_uses(src, &own, line));
        }
    }
    out
}

/// A `mod.rs`, `lib.rs` or `main.rs`: its `use child::…` paths start at its own folder.
fn is_module_root(rel: &Path) -> bool {
    matches!(
        rel.file_name().and_then(|n| n.to_str()),
        Some("mod.rs" | "lib.rs" | "main.rs")
    )
}

/// `pub use …`, `pub(crate) use …`: names handed on, as `farm-studio` reads a package's face.
fn is_reexport(line: &str) -> bool {
    line.starts_with("pub use ") || (line.starts_with("pub(") && line.contains(") use "))
}

fn child_uses(src: &Path, own: &Path, line: &str) -> Option<PathBuf> {
    let path = line.strip_prefix("use ")?;
    let segs = segments(path);
    let first = segs.first()?;
    let child = src.join(own).join(first);
    (child.with_extension("rs").is_file() || child.is_dir()).then(|| resolve(src, own, &segs))?
}

/// The identifiers of a path (`a::b::{c, d}` gives `a`, `b`).
fn segments(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = path;
    loop {
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if name.is_empty() {
            return out;
        }
        rest = &rest[name.len()..];
        out.push(name);
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => return out,
        }
    }
}

/// The folder (relative to `src`) whose children the module in `rel` declares: `a/b.rs` and
/// `a/b/mod.rs` both declare `a/b/…`; `lib.rs` declares the top level.
fn module_dir(rel: &Path) -> PathBuf {
    let parent = rel.parent().unwrap_or(Path::new("")).to_path_buf();
    match rel.file_stem().and_then(|s| s.to_str()) {
        Some("mod" | "lib" | "main") => parent,
        Some(stem) => parent.join(stem.strip_suffix("_tests").unwrap_or(stem)),
        None => parent,
    }
}

fn parent_dir(dir: &Path) -> PathBuf {
    dir.parent().unwrap_or(Path::new("")).to_path_buf()
}

/// The file that defines `segs` under the module folder `dir`: down through folders while a
/// segment names one, to the segment's own file, else to the module file of the folder reached.
fn resolve(src: &Path, dir: &Path, segs: &[String]) -> Option<PathBuf> {
    let mut dir = dir.to_path_buf();
    for seg in segs {
        let file = dir.join(format!("{seg}.rs"));
        if src.join(&dir).join(seg).is_dir() {
            dir = dir.join(seg);
        } else if src.join(&file).is_file() {
            return Some(file);
        } else {
            break;
        }
    }
    module_file(src, &dir)
}

/// The file of the module whose children live in `dir`.
fn module_file(src: &Path, dir: &Path) -> Option<PathBuf> {
    if dir.as_os_str().is_empty() {
        return ["lib.rs", "main.rs"]
            .iter()
            .map(PathBuf::from)
            .find(|f| src.join(f).is_file());
    }
    let inside = dir.join("mod.rs");
    if src.join(&inside).is_file() {
        return Some(inside);
    }
    Some(dir.with_extension("rs")).filter(|f| src.join(f).is_file())
}

/// The graph between a crate's top-level rooms (a top-level file, or a folder as one room);
/// `lib.rs` and `main.rs` are the crate's face, not rooms.
pub fn folder_graph(graph: &Graph) -> BTreeMap<String, BTreeSet<String>> {
    let room = |p: &Path| -> Option<String> {
        let first = p.components().next()?.as_os_str().to_str()?.to_owned();
        let name = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
        (!["lib", "main", "bin"].contains(&name.as_str())).then_some(name)
    };
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, targets) in graph {
        let Some(a) = room(from) else { continue };
        let entry = out.entry(a.clone()).or_default();
        entry.extend(targets.iter().filter_map(|t| room(t)).filter(|b| *b != a));
    }
    out
}

/// A cycle in a graph, if there is one (its nodes, the first repeated at the end).
pub fn find_cycle<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Option<Vec<N>> {
    fn visit<N: Ord + Clone>(
        node: &N,
        graph: &BTreeMap<N, BTreeSet<N>>,
        path: &mut Vec<N>,
        done: &mut BTreeSet<N>,
    ) -> Option<Vec<N>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.clone());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

/// The top-level modules `lib.rs` declares, in its order: the layers, lowest first.
pub fn declared_modules(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = ["pub(crate) mod ", "pub mod ", "mod "]
                .iter()
                .find_map(|p| l.strip_prefix(p))?;
            l.strip_suffix(';').map(str::to_owned)
        })
        .collect()
}
