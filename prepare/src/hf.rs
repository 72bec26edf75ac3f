//! Finding the Hugging Face CLI the way users have it installed (HF_BIN, `hf` or
//! `huggingface-cli` on PATH, ~/.local/bin, the guides' venvs, else `python3 -m
//! huggingface_hub`), and the `download` command line for a tree.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::weights::Fetch;
use crate::PrepareError;

/// A runnable Hugging Face CLI: `program args… download …`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfCli {
    pub program: PathBuf,
    pub args: Vec<String>,
}

/// Where to look, so tests can point it elsewhere.
#[derive(Debug, Clone)]
pub struct Search {
    /// HF_BIN (empty: search).
    pub hf_bin: String,
    pub path: Option<OsString>,
    pub home: Option<PathBuf>,
}

impl Search {
    pub fn from_env(hf_bin: &str) -> Self {
        Self {
            hf_bin: hf_bin.to_owned(),
            path: std::env::var_os("PATH"),
            home: std::env::var_os("HOME").map(PathBuf::from),
        }
    }
}

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The first CLI found; an error listing every place searched otherwise.
pub fn locate(search: &Search) -> Result<HfCli, PrepareError> {
    let cli = |program: PathBuf| HfCli {
        program,
        args: Vec::new(),
    };
    if !search.hf_bin.is_empty() {
        let p = PathBuf::from(&search.hf_bin);
        let resolved = if p.components().count() > 1 {
            Some(p.clone())
        } else {
            on_path(&search.hf_bin, search.path.as_ref())
        };
        return match resolved.filter(|p| executable(p)) {
            Some(p) => Ok(cli(p)),
            None => Err(PrepareError::HfBinUnusable(search.hf_bin.clone())),
        };
    }
    let mut searched = Vec::new();
    for name in ["hf", "huggingface-cli"] {
        if let Some(p) = on_path(name, search.path.as_ref()) {
            return Ok(cli(p));
        }
        searched.push(format!("{name} on PATH"));
    }
    if let Some(home) = &search.home {
        for rel in [".local/bin/hf", ".hf-cli/venv/bin/hf"] {
            let p = home.join(rel);
            if executable(&p) {
                return Ok(cli(p));
            }
            searched.push(p.display().to_string());
        }
    }
    let opt = PathBuf::from("/opt/hf-cli/venv/bin/hf");
    if executable(&opt) {
        return Ok(cli(opt));
    }
    searched.push(opt.display().to_string());
    if let Some(python) = on_path("python3", search.path.as_ref()) {
        let importable = Command::new(&python)
            .args(["-c", "import huggingface_hub.commands.huggingface_cli"])
            .output()
            .is_ok_and(|o| o.status.success());
        if importable {
            return Ok(HfCli {
                program: python,
                args: vec!["-m".into(), "huggingface_hub.commands.huggingface_cli".into()],
            });
        }
    }
    searched.push("python3 -m huggingface_hub.commands.huggingface_cli".into());
    Err(PrepareError::NoHfCli(searched))
}

fn on_path(name: &str, path: Option<&OsString>) -> Option<PathBuf> {
    std::env::split_paths(path?)
        .map(|d| d.join(name))
        .find(|p| executable(p))
}

impl HfCli {
    /// `… download REPO [--revision R] [--include F]… [--local-dir D] [--max-workers N]`, with
    /// HF_HOME set when the tree lives in a cache.
    pub fn download(&self, fetch: &Fetch) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args).args(download_args(fetch));
        if let Some(home) = &fetch.hf_home {
            cmd.env("HF_HOME", home);
        }
        cmd
    }

    /// The command line as a user would type it (for logs and `--dry-run`).
    pub fn describe(&self, fetch: &Fetch) -> String {
        let mut words: Vec<String> = Vec::new();
        if let Some(home) = &fetch.hf_home {
            words.push(format!("HF_HOME={}", home.display()));
        }
        words.push(self.program.display().to_string());
        words.extend(self.args.iter().cloned());
        words.extend(download_args(fetch));
        words.join(" ")
    }
}

fn download_args(fetch: &Fetch) -> Vec<String> {
    let mut a = vec!["download".to_owned(), fetch.repo.clone()];
    if let Some(r) = &fetch.revision {
        a.extend(["--revision".to_owned(), r.clone()]);
    }
    for f in &fetch.include {
        a.extend(["--include".to_owned(), f.clone()]);
    }
    if let Some(d) = &fetch.local_dir {
        a.extend(["--local-dir".to_owned(), d.display().to_string()]);
    }
    if let Some(n) = fetch.max_workers {
        a.extend(["--max-workers".to_owned(), n.to_string()]);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_bin(dir: &Path, name: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn hf_on_path_wins_over_huggingface_cli_and_hf_bin_wins_over_both() {
        let dir = tempfile::tempdir().unwrap();
        let hf = fake_bin(dir.path(), "hf");
        fake_bin(dir.path(), "huggingface-cli");
        let mine = fake_bin(dir.path(), "my-hf");
        let mut search = Search {
            hf_bin: String::new(),
            path: Some(dir.path().as_os_str().to_owned()),
            home: None,
        };
        assert_eq!(locate(&search).unwrap().program, hf);
        search.hf_bin = mine.display().to_string();
        assert_eq!(locate(&search).unwrap().program, mine);
        search.hf_bin = "/nonexistent/hf".into();
        assert!(matches!(locate(&search), Err(PrepareError::HfBinUnusable(_))));
    }

    #[test]
    fn the_guides_venv_is_found_from_home() {
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(home.path().join(".hf-cli/venv/bin")).unwrap();
        let hf = fake_bin(&home.path().join(".hf-cli/venv/bin"), "hf");
        let search = Search {
            hf_bin: String::new(),
            path: Some(OsString::from("/nonexistent")),
            home: Some(home.path().to_owned()),
        };
        assert_eq!(locate(&search).unwrap().program, hf);
    }

    #[test]
    fn download_lines_match_the_guides() {
        let cli = HfCli {
            program: "hf".into(),
            args: Vec::new(),
        };
        let fetch = Fetch {
            repo: "org/m".into(),
            revision: Some("abc".into()),
            include: vec!["a.json".into()],
            local_dir: Some("/w".into()),
            hf_home: Some("/h".into()),
            max_workers: Some(8),
        };
        assert_eq!(
            cli.describe(&fetch),
            "HF_HOME=/h hf download org/m --revision abc --include a.json --local-dir /w --max-workers 8"
        );
    }
}
