//! The build recipe: which files of BUILD_CONTEXT go into a build (and into its stamp). Left out:
//! what `.dockerignore` names, VCS data and caches, and every path sparkgate itself fills or that
//! holds secrets — the weight trees, caches, ship and log directories, packed Engram files and
//! the env file — since the default context is the deployment directory that holds them too.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use sparkgate_config::{Config, Weights};

use crate::PrepareError;

/// A build context with what is left out of it.
#[derive(Debug)]
pub struct Recipe {
    dir: PathBuf,
    /// Absolute paths (canonical where they exist) never included.
    excluded: Vec<PathBuf>,
    /// `.dockerignore` patterns (no `!` exceptions).
    ignore: Vec<String>,
}

impl Recipe {
    pub fn of(config: &Config) -> Recipe {
        let p = &config.preparation;
        let mut excluded: Vec<PathBuf> = vec![
            p.ship_dir.clone(),
            config.supervision.log_dir.clone(),
            config.storage.cache_root.clone().into(),
        ];
        excluded.extend(config.env_file.clone());
        match &config.storage.weights {
            Weights::DeepSeek {
                model_host,
                engram_dir,
                engram_src,
                ..
            } => excluded.extend([model_host, engram_dir, engram_src].map(PathBuf::from)),
            Weights::Glm { hf_home, .. } => excluded.push(hf_home.into()),
        }
        if let Some(pack) = &p.pack {
            excluded.push(pack.head_dir.clone().into());
        }
        Recipe::new(&p.build_context, excluded)
    }

    pub fn new(dir: &Path, excluded: Vec<PathBuf>) -> Recipe {
        let excluded = excluded
            .into_iter()
            .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
            .collect();
        let ignore = std::fs::read_to_string(dir.join(".dockerignore"))
            .unwrap_or_default()
            .lines()
            .map(|l| l.trim().trim_start_matches("./").trim_end_matches('/').to_owned())
            .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('!'))
            .collect();
        Recipe {
            dir: dir.to_path_buf(),
            excluded,
            ignore,
        }
    }

    fn left_out(&self, rel: &Path) -> bool {
        let cache = rel.components().any(|c| {
            let c = c.as_os_str().to_string_lossy();
            matches!(c.as_ref(), ".git" | "__pycache__") || c.ends_with(".pyc")
        });
        if cache {
            return true;
        }
        let text = rel.to_string_lossy();
        if self.ignore.iter().any(|pattern| ignore_matches(pattern, &text)) {
            return true;
        }
        let abs = self.dir.join(rel);
        let abs = std::fs::canonicalize(&abs).unwrap_or(abs);
        self.excluded.iter().any(|e| abs.starts_with(e))
    }

    /// Every regular file of the recipe (relative paths, sorted; symlinks followed).
    pub fn files(&self) -> Result<Vec<PathBuf>, PrepareError> {
        let io = |e: std::io::Error| PrepareError::Recipe(format!("{}: {e}", self.dir.display()));
        let mut out = Vec::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            for entry in std::fs::read_dir(self.dir.join(&rel)).map_err(io)? {
                let rel = rel.join(entry.map_err(io)?.file_name());
                if self.left_out(&rel) {
                    continue;
                }
                let Ok(meta) = std::fs::metadata(self.dir.join(&rel)) else {
                    continue; // a dangling symlink is no part of a build
                };
                if meta.is_dir() {
                    stack.push(rel);
                } else if meta.is_file() {
                    out.push(rel);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// sha256 over each file's relative path and content hash, in path order (16 hex digits):
    /// any edit, addition or removal in the recipe changes it; mtimes and caches do not.
    pub fn stamp(&self) -> Result<String, PrepareError> {
        let mut all = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        for rel in self.files()? {
            let path = self.dir.join(&rel);
            let io = |e: std::io::Error| PrepareError::Recipe(format!("{}: {e}", path.display()));
            let mut file = std::fs::File::open(&path).map_err(io)?;
            let mut one = Sha256::new();
            loop {
                let n = file.read(&mut buf).map_err(io)?;
                if n == 0 {
                    break;
                }
                one.update(&buf[..n]);
            }
            all.update(rel.to_string_lossy().as_bytes());
            all.update([0]);
            all.update(one.finalize());
        }
        let hex: String = all.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Ok(hex[..16].to_owned())
    }

    /// The recipe as a tar (the Docker API's build input).
    pub fn tar(&self) -> Result<Vec<u8>, PrepareError> {
        let io = |e: std::io::Error| PrepareError::Recipe(format!("{}: {e}", self.dir.display()));
        let mut builder = tar::Builder::new(Vec::new());
        builder.follow_symlinks(true);
        for rel in self.files()? {
            builder.append_path_with_name(self.dir.join(&rel), &rel).map_err(io)?;
        }
        builder.into_inner().map_err(io)
    }
}

/// `.dockerignore` matching: `*` within a path segment, `**` across segments; a pattern that
/// matches a directory leaves out everything below it.
fn ignore_matches(pattern: &str, path: &str) -> bool {
    let pat: Vec<&str> = pattern.split('/').collect();
    let segs: Vec<&str> = path.split('/').collect();
    (1..=segs.len()).any(|n| segments_match(&pat, &segs[..n]))
}

fn segments_match(pat: &[&str], segs: &[&str]) -> bool {
    match (pat.first(), segs.first()) {
        (None, None) => true,
        (Some(&"**"), _) => (0..=segs.len()).any(|skip| segments_match(&pat[1..], &segs[skip..])),
        (Some(p), Some(s)) => glob(p, s) && segments_match(&pat[1..], &segs[1..]),
        _ => false,
    }
}

/// `*` and `?` within one segment.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Dockerfile"), "FROM scratch\n").unwrap();
        std::fs::create_dir_all(dir.path().join("overlay/__pycache__")).unwrap();
        std::fs::write(dir.path().join("overlay/a.py"), "x = 1\n").unwrap();
        dir
    }

    #[test]
    fn the_stamp_follows_content_and_names_not_caches() {
        let dir = context();
        let recipe = || Recipe::new(dir.path(), Vec::new());
        let first = recipe().stamp().unwrap();
        std::fs::write(dir.path().join("overlay/__pycache__/a.pyc"), "cache").unwrap();
        assert_eq!(recipe().stamp().unwrap(), first, "caches are not the recipe");
        std::fs::write(dir.path().join("overlay/a.py"), "x = 2\n").unwrap();
        let edited = recipe().stamp().unwrap();
        assert_ne!(edited, first);
        std::fs::rename(dir.path().join("overlay/a.py"), dir.path().join("overlay/b.py")).unwrap();
        assert_ne!(recipe().stamp().unwrap(), edited, "a rename changes the recipe");
    }

    #[test]
    fn weights_secrets_and_dockerignored_paths_stay_out() {
        let dir = context();
        for d in ["model", "logs", "build/out"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        std::fs::write(dir.path().join("model/model-00001.safetensors"), "w").unwrap();
        std::fs::write(dir.path().join(".env"), "HF_TOKEN=hf_x").unwrap();
        std::fs::write(dir.path().join("build/out/x.o"), "o").unwrap();
        std::fs::write(dir.path().join("notes.md"), "n").unwrap();
        std::fs::write(dir.path().join(".dockerignore"), "# comment\nbuild/\n*.md\n**/*.tmp\n").unwrap();
        std::fs::write(dir.path().join("overlay/x.tmp"), "t").unwrap();
        let recipe = Recipe::new(
            dir.path(),
            vec![
                dir.path().join("model"),
                dir.path().join(".env"),
                dir.path().join("logs"),
            ],
        );
        let files: Vec<String> = recipe
            .files()
            .unwrap()
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        assert_eq!(files, [".dockerignore", "Dockerfile", "overlay/a.py"]);
        let tar = recipe.tar().unwrap();
        let mut archive = tar::Archive::new(&tar[..]);
        assert_eq!(archive.entries().unwrap().count(), 3);
    }

    #[test]
    fn dockerignore_globs() {
        assert!(ignore_matches("build", "build/out/x.o"));
        assert!(ignore_matches("*.md", "notes.md"));
        assert!(!ignore_matches("*.md", "docs/notes.md"));
        assert!(ignore_matches("**/*.md", "docs/notes.md"));
        assert!(ignore_matches("docs/*/x", "docs/a/x"));
        assert!(!ignore_matches("docs/*/x", "docs/a/b/x"));
        assert!(ignore_matches("model-0000?.bin", "model-00001.bin"));
    }
}
