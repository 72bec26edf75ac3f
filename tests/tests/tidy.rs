//! Repository hygiene over every crate: each Rust file opens with a `//!` line, no file grows
//! past the size limit and no non-test function past 80 lines, no allowed argument pile-up, no
//! import circle between a crate's files or folders, and the gateway's layers (the order its
//! `lib.rs` declares them) import only downward.

use std::path::{Path, PathBuf};

use sparkgate_tests::tidy::{
    declared_modules, find_cycle, folder_graph, function_lengths, import_graph, is_test_file, root, rust_files,
    without_tests, CRATES,
};

const MAX_LINES: usize = 650;
const MAX_FN_LINES: usize = 80;

/// Files allowed past MAX_LINES, with why.
const LONG_FILES: &[(&str, &str)] = &[];

fn workspace_files() -> Vec<PathBuf> {
    let files: Vec<PathBuf> = CRATES.iter().flat_map(|c| rust_files(&root().join(c))).collect();
    assert!(files.len() > 100, "found the workspace's sources");
    files
}

fn src(krate: &str) -> PathBuf {
    root().join(krate).join("src")
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

#[test]
fn no_non_test_function_in_any_crate_is_over_80_lines() {
    let mut long = Vec::new();
    for krate in CRATES {
        for file in rust_files(&src(krate)).iter().filter(|f| !is_test_file(f)) {
            let text = std::fs::read_to_string(file).expect("read");
            for (head, at, n) in function_lengths(without_tests(&text)) {
                if n > MAX_FN_LINES {
                    long.push(format!("{}:{at}: {n} lines: {head}", file.display()));
                }
            }
        }
    }
    assert!(long.is_empty(), "functions over {MAX_FN_LINES} lines: {long:#?}");
    let sample = function_lengths("fn a() {\n    x;\n}\n\n    pub(crate) fn b(&self) -> u8 {\n        1\n    }\n");
    assert_eq!(
        sample,
        [
            ("fn a() {".to_owned(), 1, 3),
            ("pub(crate) fn b(&self) -> u8 {".to_owned(), 5, 3)
        ]
    );
    let cut = without_tests("fn a() {}\n#[cfg(test)]\nmod tests {\n    fn long() {}\n}\n");
    assert_eq!(cut, "fn a() {}\n", "test modules are not counted");
}

#[test]
fn no_function_allows_an_argument_pile_up() {
    let needle = ["too_many", "arguments"].join("_");
    let found: Vec<String> = workspace_files()
        .into_iter()
        .filter(|p| std::fs::read_to_string(p).expect("read").contains(&needle))
        .map(|p| p.display().to_string())
        .collect();
    assert!(found.is_empty(), "a context struct instead of `{needle}`: {found:#?}");
}

#[test]
fn no_crate_has_an_import_circle_between_its_files_or_its_folders() {
    let mut circles = Vec::new();
    for krate in CRATES {
        let graph = import_graph(&src(krate));
        let edges: usize = graph.values().map(|t| t.len()).sum();
        assert!(graph.len() < 3 || edges > 0, "{krate}: read its imports: {graph:?}");
        if let Some(c) = find_cycle(&graph) {
            circles.push(format!("{krate}: files {c:?}"));
        }
        if let Some(c) = find_cycle(&folder_graph(&graph)) {
            circles.push(format!("{krate}: folders {c:?}"));
        }
    }
    assert!(circles.is_empty(), "import circles: {circles:#?}");
}

#[test]
fn the_gateways_layers_import_only_the_layers_below_them() {
    let lib = std::fs::read_to_string(src("gateway").join("lib.rs")).expect("read lib.rs");
    let layers = declared_modules(&lib);
    assert!(layers.len() >= 8, "lib.rs declares the layers in order: {layers:?}");
    let graph = folder_graph(&import_graph(&src("gateway")));
    let rank = |m: &str| layers.iter().position(|l| l == m);
    let mut upward = Vec::new();
    for (from, targets) in &graph {
        for to in targets {
            if let (Some(a), Some(b)) = (rank(from), rank(to)) {
                if b > a {
                    upward.push(format!("{from} -> {to}"));
                }
            }
        }
    }
    assert!(upward.is_empty(), "imports that run back up the layers: {upward:#?}");
    assert!(
        graph["pipeline"].contains("api"),
        "the scan sees the pipeline's imports"
    );
}

/// The scanner itself: a circle through `super::` and a parent's `use child::…` is found, and a
/// clean tree has none.
#[test]
fn the_import_scan_resolves_crate_super_and_child_paths() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |rel: &str, text: &str| {
        let p = dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "mod a;\nmod b;\n");
    write("a/mod.rs", "mod x;\nuse x::X;\n");
    write("a/x.rs", "use crate::b::Y;\npub(crate) struct X;\n");
    write("b.rs", "pub(crate) struct Y;\n");
    let graph = import_graph(dir.path());
    assert!(graph[Path::new("a/mod.rs")].contains(Path::new("a/x.rs")));
    assert!(graph[Path::new("a/x.rs")].contains(Path::new("b.rs")));
    assert_eq!(find_cycle(&graph), None);
    write("b.rs", "use crate::a::x::X;\npub(crate) struct Y;\n");
    let graph = import_graph(dir.path());
    assert!(
        find_cycle(&folder_graph(&graph)).is_some(),
        "a -> b -> a between folders"
    );
    write("b.rs", "pub(crate) struct Y;\n");
    write("a/x.rs", "use super::Z;\npub(crate) struct X;\n");
    let graph = import_graph(dir.path());
    assert!(find_cycle(&graph).is_some(), "a/mod.rs -> a/x.rs -> a/mod.rs");
}

/// Every path ARCHITECTURE.md names in backticks — a file (`.rs`, `.md`, `.sh`, `.toml`,
/// `.json`, `.py`) or a folder (`…/`) — exists in the workspace (matched by its last
/// components), and each of the gateway's layers has its own section.
#[test]
fn the_architecture_codemap_names_only_what_exists_and_has_a_section_per_layer() {
    let root = root();
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let mut known = Vec::new();
    collect_paths(&root, &root, &mut known);
    let looks_like_path = |t: &str| {
        let file = [".rs", ".md", ".sh", ".toml", ".json", ".py"]
            .iter()
            .any(|e| t.ends_with(e));
        (file || t.ends_with('/'))
            && !t.starts_with('/')
            // `LOG_DIR/ranks.json`: a place under a configured directory, not the workspace's.
            && !t.split('/').next().is_some_and(|c| c.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
            && !t.contains(|c: char| c.is_whitespace() || "*{}<>:$=".contains(c))
    };
    let missing: Vec<&str> = text
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| looks_like_path(t))
        .filter(|t| !known.iter().any(|k| k.ends_with(t.trim_end_matches('/'))))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names what does not exist: {missing:#?}"
    );
    let lib = std::fs::read_to_string(src("gateway").join("lib.rs")).expect("read lib.rs");
    for layer in declared_modules(&lib).iter().filter(|m| *m != "microbench") {
        let folder = format!("#### `gateway/src/{layer}/`");
        let file = format!("#### `gateway/src/{layer}.rs`");
        assert!(
            text.contains(&folder) || text.contains(&file),
            "no section for the layer {layer}"
        );
    }
}

fn collect_paths(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if [".git", "target"].iter().any(|n| name == *n) {
            continue;
        }
        out.push(path.strip_prefix(root).expect("under root").to_path_buf());
        if path.is_dir() {
            collect_paths(root, &path, out);
        }
    }
}
