//! `sparkgate download` with a stand-in `hf` on PATH (the hub is unreachable here): missing trees
//! run the guides' command lines, complete trees run none, and unusable setups say why.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::SIM;
use sparkgate_tests::test_gateway::sparkgate_bin;

struct Setup {
    dir: tempfile::TempDir,
    bin: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().expect("temp dir");
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake-hf");
        std::fs::copy(&fake, bin.join("hf")).expect("copy the stand-in hf");
        Setup { dir, bin }
    }

    fn path(&self, rel: &str) -> String {
        self.dir.path().join(rel).display().to_string()
    }

    /// Runs `sparkgate [--profile P] download ARGS` with the stand-in first on PATH.
    fn download(&self, profile: &str, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
        let path = format!("{}:{}", self.bin.display(), std::env::var("PATH").unwrap_or_default());
        let mut cmd = Command::new(sparkgate_bin(SIM));
        // GLM's cache lives under HF_HOME; DeepSeek's trees are plain directories.
        if profile.starts_with("glm") {
            cmd.env("HF_HOME", self.path("hf-home"));
        } else {
            cmd.env_remove("HF_HOME");
        }
        let out = cmd
            .args(["--profile", profile, "download"])
            .args(args)
            .env("PATH", path)
            .env("HF_LOG", self.path("hf.log"))
            .env("DEPLOY_DIR", self.dir.path())
            .env("MODEL_HOST", self.path("model"))
            .env("ENGRAM_DIR", self.path("engram"))
            .env_remove("HF_BIN")
            .envs(env.iter().copied())
            .output()
            .expect("run sparkgate download");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    }

    fn hf_calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("hf.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

#[test]
fn deepseek_missing_trees_run_the_guides_commands_and_a_complete_tree_runs_none() {
    let s = Setup::new();
    let (code, out) = s.download("deepseek-v4.1-flash", &[], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("0 of 39 model-*.safetensors shards present"), "{out}");
    assert_eq!(
        s.hf_calls(),
        [
            format!(
                "HF_HOME= download Mia-AiLab/DeepSeek-V4.1-Flash-EXL3-2.9bpw --local-dir {} --max-workers 8",
                s.path("model")
            ),
            format!(
                "HF_HOME= download deepseek-ai/DeepSeek-V4.1-Flash --include model-00047-of-00048.safetensors \
                 --include model-00048-of-00048.safetensors --include model.safetensors.index.json \
                 --include config.json --local-dir {}",
                s.path("engram")
            ),
        ]
    );
    assert!(out.contains("weights complete (2 tree(s) downloaded)"), "{out}");

    let (code, out) = s.download("deepseek-v4.1-flash", &[], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("nothing to download"), "{out}");
    assert_eq!(s.hf_calls().len(), 2, "a complete tree runs no download");

    // One empty shard makes the model tree incomplete again; only it is fetched.
    std::fs::write(s.dir.path().join("model/model-00007-of-00039.safetensors"), b"").unwrap();
    let (code, out) = s.download("deepseek-v4.1-flash", &[], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("38 of 39"), "{out}");
    let calls = s.hf_calls();
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(
        calls[2].contains("Mia-AiLab/DeepSeek-V4.1-Flash-EXL3-2.9bpw"),
        "{calls:?}"
    );
}

#[test]
fn glm_downloads_the_pinned_revision_and_the_dflash_draft_into_hf_home() {
    let s = Setup::new();
    let (code, out) = s.download("glm-5.3-flash", &[], &[("FAKE_HF_SHARDS", "120")]);
    assert_eq!(code, 0, "{out}");
    let home = s.path("hf-home");
    assert_eq!(
        s.hf_calls(),
        [
            format!(
                "HF_HOME={home} download Mia-AiLab/GLM-5.3-Flash-EXL3-TR3-4bpw \
                 --revision 25a44fdbf16862a46b7cc9921142c6c81350af2f --max-workers 8"
            ),
            format!("HF_HOME={home} download incoai/GLM-5.3-Flash-DFlash2"),
        ]
    );
    let (code, out) = s.download("glm-5.3-flash", &[], &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(s.hf_calls().len(), 2, "complete: {out}");
}

#[test]
fn report_only_modes_and_unusable_setups_say_why_and_run_nothing() {
    let s = Setup::new();
    let (code, out) = s.download("deepseek-v4.1-flash", &["--dry-run"], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("would run: {}/hf download", s.bin.display())),
        "{out}"
    );

    let (code, out) = s.download("deepseek-v4.1-flash", &[], &[("AUTO_DOWNLOAD", "0")]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("AUTO_DOWNLOAD=0: not downloading"), "{out}");

    let (code, out) = s.download("deepseek-v4.1-flash", &[], &[("HF_BIN", "/nonexistent/hf")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("HF_BIN=/nonexistent/hf is not an executable file"),
        "{out}"
    );
    assert!(s.hf_calls().is_empty(), "nothing ran: {:?}", s.hf_calls());

    // A stand-in that fails: the error names the command and says a rerun resumes.
    let failing = s.dir.path().join("bin/failing-hf");
    std::fs::write(&failing, "#!/bin/sh\nexit 3\n").unwrap();
    std::fs::set_permissions(&failing, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (code, out) = s.download("deepseek-v4.1-flash", &[], &[("HF_BIN", failing.to_str().unwrap())]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("failed (exit status: 3); run it again to resume"), "{out}");
}
